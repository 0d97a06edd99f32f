"""The thin command line: each verb lives in its own `commands_*` module.

A verb module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. Errors the user can fix are `UserError`: printed on
stderr, exit 2, nothing on stdout.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys

from zenvllm import (
    __version__,
    commands_bench,
    commands_doctor,
    commands_image,
    commands_plan,
)
from zenvllm.errors import UserError

# Verb modules, in the order `--help` lists them.
VERBS = (commands_plan, commands_doctor, commands_image, commands_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zenvllm", description="Run vLLM well on AMD EPYC CPUs.")
    parser.add_argument("--version", action="version", version=f"zenvllm {__version__}")
    subparsers = parser.add_subparsers(dest="verb", required=True)
    for module in VERBS:
        module.register(subparsers)
    return parser


def interrupted(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so staged outputs and containers are cleaned up."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        return args.func(args)
    except UserError as err:
        print(f"zenvllm {args.verb}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `zenvllm plan | head`: the reader has what it wanted
        # Python's exit-time flush of stdout would fail again (the recipe in its docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as err:
        why = str(err) or "SIGINT"
        print(
            f"zenvllm {args.verb}: interrupted ({why}); nothing half-written was left",
            file=sys.stderr,
        )
        return 128 + getattr(signal, why, signal.SIGINT)
    except OSError as err:  # a full disk, a read-only or vanished directory
        where = f" ({err.filename})" if err.filename else ""
        fix = (
            "free space there or choose another path"
            if err.errno == errno.ENOSPC
            else "check the path and its permissions"
        )
        print(
            f"zenvllm {args.verb}: error: {err.strerror or err}{where}; nothing half-written "
            f"was left; {fix}",
            file=sys.stderr,
        )
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
