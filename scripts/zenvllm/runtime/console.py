"""Run a set of verbs as one command line, with zenvllm's error contract.

A verb module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. Errors the user can fix are `UserError`: printed on
stderr, exit 2, nothing on stdout. SIGTERM unwinds like Ctrl-C, so staged
outputs and started containers are cleaned up. The full CLI (`zenvllm.cli`) and
the host's (`python3 -m zenvllm.runtime`) differ only in their verbs.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from types import ModuleType

from zenvllm import __version__
from zenvllm.core.errors import UserError


def build_parser(verbs: tuple[ModuleType, ...], prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run vLLM well on AMD EPYC CPUs.")
    parser.add_argument("--version", action="version", version=f"zenvllm {__version__}")
    subparsers = parser.add_subparsers(dest="verb", required=True)
    for module in verbs:
        module.register(subparsers)
    return parser


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def os_error(verb: str, err: OSError) -> str:
    """A full disk, a read-only or vanished directory: what, where and the fix."""
    where = f" ({err.filename})" if err.filename else ""
    fix = (
        "free space there or choose another path"
        if err.errno == errno.ENOSPC
        else "check the path and its permissions"
    )
    return (
        f"zenvllm {verb}: error: {err.strerror or err}{where}; nothing half-written was left; {fix}"
    )


def run(verbs: tuple[ModuleType, ...], argv: list[str] | None, prog: str = "zenvllm") -> int:
    args = build_parser(verbs, prog).parse_args(argv)
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        code: int = args.func(args)
        return code
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
    except OSError as err:
        print(os_error(args.verb, err), file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
