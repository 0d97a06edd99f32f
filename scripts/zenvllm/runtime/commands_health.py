"""`python3 -m zenvllm.runtime health wait URL... [--timeout S] [--every S]`: until each
URL answers 200, in one process. The instances role waits so for an instance's /health
in a rollout; it prints the seconds waited, or exits 1 with why at the deadline."""

from __future__ import annotations

import argparse
import sys
import time

from zenvllm.core import gate
from zenvllm.runtime import health

MAX_WAIT = 86_400.0  # a day: a slower start is a fault, not a wait
FIX = "give seconds, e.g. --timeout 900 --every 1"


def run_wait(args: argparse.Namespace) -> int:
    timeout = gate.number_text(args.timeout, "--timeout", 0, MAX_WAIT, FIX)
    every = gate.number_text(args.every, "--every", 0, MAX_WAIT, FIX)
    start = time.monotonic()
    problem = health.wait(args.url, timeout, every)
    if problem:
        print(f"zenvllm health: {problem}", file=sys.stderr)
        return 1
    print(f"{time.monotonic() - start:.1f}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("health", help="wait for instances' /health")
    verbs = p.add_subparsers(dest="action", required=True)
    w = verbs.add_parser("wait", help="until each URL answers 200, or the timeout")
    w.add_argument("url", nargs="+", help="e.g. http://127.0.0.1:8001/health")
    w.add_argument("--timeout", default="900", help="seconds in all (default 900)")
    w.add_argument("--every", default="1", help="seconds between asks (default 1)")
    w.set_defaults(func=run_wait)
