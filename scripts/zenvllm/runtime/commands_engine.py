"""`python3 -m zenvllm.runtime engine decide|socket|record`: which container engine
serves this host (hostengine.py, which also runs alone as a script: `make engine`).

The host role runs it from the planner zipapp before anything changes on the host.
"""

from __future__ import annotations

import argparse

from zenvllm.runtime import hostengine


def run_engine(args: argparse.Namespace) -> int:
    return hostengine.main(args.rest)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "engine",
        help="which container engine serves this host (engine decide|socket|record -h)",
        add_help=False,
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=run_engine)
