"""`python3 -m zenvllm.runtime compile-cache prepare|seed`: the instances role's compile
caches on the host, one process per step of a rollout (runtime/compile_dirs.py,
runtime/compile_seed.py). Each prints what it did as JSON for the role's changed_when;
prepare's --dry-run (check mode) says what it would do and writes nothing."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from zenvllm.core.errors import UserError
from zenvllm.runtime import compile_dirs, compile_seed
from zenvllm.runtime.commands_files import report


def run_prepare(args: argparse.Namespace) -> int:
    try:
        return report(compile_dirs.prepare(args.root, args.dirs, args.owner, args.dry_run))
    except OSError as err:
        raise UserError(f"could not make the compile caches under {args.root}: {err}") from None


def run_seed(args: argparse.Namespace) -> int:
    there = compile_seed.seed(args.root, args.here, args.siblings)
    print(json.dumps({"changed": there is not None, "from": str(there) if there else None}))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("compile-cache", help="the instances' compile caches on this host")
    verbs = p.add_subparsers(dest="action", required=True)
    root = "the compile cache directory (zenvllm_instances_compile_cache_dir)"
    dry = "say what would be done; write nothing (check mode)"

    m = verbs.add_parser("prepare", help="make ROOT, its mark and each key's directory")
    m.add_argument("--root", type=Path, required=True, help=root)
    m.add_argument("--owner", required=True, help="USER:GROUP of the container (its directories)")
    m.add_argument("dirs", type=Path, nargs="*", help="each instance's directory for its key")
    m.add_argument("--dry-run", action="store_true", help=dry)
    m.set_defaults(func=run_prepare)

    s = verbs.add_parser("seed", help="fill HERE from the first SIBLING that has files")
    s.add_argument("--root", type=Path, required=True, help="the marked " + root)
    s.add_argument("here", type=Path, help="the instance's directory for its key")
    s.add_argument("siblings", type=Path, nargs="*", help="its siblings' directories, in order")
    s.set_defaults(func=run_seed)
