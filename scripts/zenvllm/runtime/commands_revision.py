"""`zenvllm revision`: a deployment's revisions on this host, as the instances role keeps
them (runtime/revisions.py) and an operator reads them.

    python3 -m zenvllm.runtime revision begin --dir D --image TAG --image-id ID \
        [--model-dir DIR ...] < plan.json
    python3 -m zenvllm.runtime revision done --dir D
    python3 -m zenvllm.runtime revision rollback --dir D [--to N]    # prints the plan to roll out
    python3 -m zenvllm.runtime revision list --dir D [--json]

begin and done print one JSON line ({"changed": ..., "revision": N}) for Ansible."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from zenvllm.core import gate, revisions
from zenvllm.runtime import revisions as files

PLAN_CAP = files.REVISION_CAP


def run_begin(args: argparse.Namespace) -> int:
    text = gate.read_stream(sys.stdin.buffer, PLAN_CAP, "the plan on stdin", files.FIX)
    plan = gate.obj(gate.parse_json(text, "the plan on stdin", files.FIX), "the plan", files.FIX)
    made = files.begin(args.dir, plan, args.image, args.image_id, args.model_dir)
    print(json.dumps({"changed": made is not None, "revision": made.number if made else 0}))
    return 0


def run_done(args: argparse.Namespace) -> int:
    made = files.done(args.dir)
    print(json.dumps({"changed": made is not None, "revision": made.number if made else 0}))
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    target = files.rollback(args.dir, args.to)
    print(f"zenvllm: rolling back to {target.summary()}", file=sys.stderr)
    print(json.dumps(target.plan))
    return 0


def run_list(args: argparse.Namespace) -> int:
    kept = sorted(files.on_disk(args.dir), key=lambda r: r.number, reverse=True)
    if args.json:
        print(json.dumps([asdict(r) | {"plan": None} for r in kept]))
        return 0
    live = revisions.serving(kept)
    for r in kept:
        print(("* " if live and r.number == live.number else "  ") + r.summary())
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("revision", help="a deployment's revisions on this host")
    verbs = p.add_subparsers(dest="action", required=True)

    def where(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--dir", type=Path, required=True, help="the deployment's revisions directory"
        )

    b = verbs.add_parser("begin", help="record the plan on stdin, pending, before a rollout")
    where(b)
    b.add_argument("--image", default="", help="the tag the plan's containers run")
    b.add_argument("--image-id", default="", help="the image ID that tag names now")
    b.add_argument("--model-dir", action="append", default=[], help="a model's directory")
    b.set_defaults(func=run_begin)
    d = verbs.add_parser("done", help="mark the pending revision deployed")
    where(d)
    d.set_defaults(func=run_done)
    r = verbs.add_parser("rollback", help="print the plan of the revision to roll back to")
    where(r)
    r.add_argument("--to", type=int, default=0, help="its number (default: the previous one)")
    r.set_defaults(func=run_rollback)
    s = verbs.add_parser("list", help="the revisions kept, newest first; * marks the serving one")
    where(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=run_list)
