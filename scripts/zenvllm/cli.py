"""The thin command line: each verb lives in its own `commands_*` module.

A verb module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. Errors the user can fix are `UserError`: printed on
stderr, exit 2, nothing on stdout.
"""

from __future__ import annotations

import argparse
import os
import sys

from zenvllm import __version__
from zenvllm.errors import UserError

# Verb modules, in the order `--help` lists them.
VERBS = (
    "zenvllm.commands_plan",
    "zenvllm.commands_doctor",
    "zenvllm.commands_image",
    "zenvllm.commands_bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zenvllm", description="Run vLLM well on AMD EPYC CPUs.")
    parser.add_argument("--version", action="version", version=f"zenvllm {__version__}")
    subparsers = parser.add_subparsers(dest="verb", required=True)
    for name in VERBS:
        module = __import__(name, fromlist=["register"])
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as err:
        print(f"zenvllm {args.verb}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `zenvllm plan | head`: the reader has what it wanted
        # Python's exit-time flush of stdout would fail again (the recipe in its docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
