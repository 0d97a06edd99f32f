"""`zenvllm model`: a model directory's manifest, and its delivery to this host.

    zenvllm model manifest DIR                    the manifest of a copy you trust
    zenvllm model check DIR --manifest M          claim DIR for a transfer (rsync's)
    zenvllm model fetch DIR --manifest M --url U  fetch from a mirror, resumable
    zenvllm model verify DIR --manifest M         every file's size and SHA-256

Each prints one JSON object (what Ansible reads); `-` reads the manifest from stdin.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from zenvllm.core import gate, modelfiles
from zenvllm.core.modelfiles import Files, Steps
from zenvllm.runtime import modelsync


def wanted(manifest: str) -> Files:
    """The manifest the files must match: from a file, or from stdin for "-"."""
    if manifest == "-":
        text = gate.read_stream(sys.stdin.buffer, gate.DOCUMENT, "stdin", modelfiles.MANIFEST_FIX)
        return modelfiles.parse_manifest(text, "the manifest on stdin")
    path = Path(manifest)
    return modelfiles.parse_manifest(
        gate.read_text(path, gate.DOCUMENT, modelfiles.MANIFEST_FIX), str(path)
    )


def report(steps: Steps, dry_run: bool) -> int:
    changed = bool(steps.transfer or steps.remove) or (steps.claim and not dry_run)
    print(json.dumps({**asdict(steps), "changed": changed}))
    return 0


def manifest(args: argparse.Namespace) -> int:
    sys.stdout.write(modelfiles.manifest_text(modelsync.manifest_of(args.dir)))
    return 0


def check(args: argparse.Namespace) -> int:
    return report(modelsync.prepare(args.dir, wanted(args.manifest), args.dry_run), args.dry_run)


def fetch(args: argparse.Namespace) -> int:
    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    token = os.environ.get("HF_TOKEN", "")
    steps = modelsync.fetch(
        args.dir, wanted(args.manifest), args.url, token, args.dry_run, progress
    )
    return report(steps, args.dry_run)


def verify(args: argparse.Namespace) -> int:
    files = modelsync.verify(args.dir, wanted(args.manifest))
    print(json.dumps({"verified": True, "files": len(files), "changed": False}))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "model", help="a model directory's manifest, and its delivery to this host"
    )
    verbs = parser.add_subparsers(dest="action", required=True)
    made = verbs.add_parser("manifest", help="print the manifest (size, SHA-256) of DIR")
    made.add_argument("dir", type=Path, metavar="DIR")
    made.set_defaults(func=manifest)
    for name, func, text in (
        ("check", check, "claim DIR for a transfer; say what it lacks"),
        ("fetch", fetch, "fetch what DIR lacks from a mirror (resumable), then verify"),
        ("verify", verify, "check every file of DIR against the manifest"),
    ):
        sub = verbs.add_parser(name, help=text)
        sub.add_argument("dir", type=Path, metavar="DIR")
        sub.add_argument(
            "--manifest", required=True, metavar="FILE", help="the manifest, or - for stdin"
        )
        if name == "fetch":
            sub.add_argument(
                "--url",
                required=True,
                help="the mirror's directory of the model, e.g. "
                "https://mirror/models/NAME or <HF_ENDPOINT>/<org>/<model>/resolve/<revision>",
            )
        if name != "verify":
            sub.add_argument("--dry-run", action="store_true", help="decide, change nothing")
        sub.set_defaults(func=func)
