"""`zenvllm doctor`: one line per check of what this host has and lacks, per image target."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from zenvllm.core.topology import read_host
from zenvllm.runtime.doctor import FAIL, diagnose, render, to_dict
from zenvllm.runtime.probes import probe


def run(args: argparse.Namespace) -> int:
    host = read_host(args.root)
    checks = diagnose(host, probe(args.root))
    print(json.dumps(to_dict(host, checks), indent=2) if args.json else render(host, checks))
    # Non-zero only when something blocks serving (no AVX2, NUMA syscalls refused).
    return 1 if any(c.status == FAIL for c in checks) else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor", help="what this host has and lacks for each image target"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="check sysfs/procfs under this directory (live-only probes become 'not checked')",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(func=run)
