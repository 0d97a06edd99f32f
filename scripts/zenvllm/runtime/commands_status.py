"""`zenvllm status`: one line per instance on this host: where it runs against its
plan, which backend vLLM selected, its health and load. Exit 1 when one has drifted
or is down (a check a timer or a playbook can run)."""

from __future__ import annotations

import argparse
import json

from zenvllm.core import arguments
from zenvllm.core.topology import format_cpu_list
from zenvllm.runtime import status

COLUMNS = ("host", "name", "cpus", "node", "backend", "placement", "health", "run", "wait", "tok/s")


def cell(value: object) -> str:
    return (
        "-"
        if value is None or value == ""
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def render(rows: list[dict]) -> str:
    """The table, then each drifted instance's problems."""
    if not rows:
        return "no zenvllm instances on this host"
    table = [COLUMNS] + [
        (
            r["host"],
            r["name"],
            format_cpu_list(r["cpus"]),
            format_cpu_list(r["node"]),
            r["backend"],
            r["placement"],
            r["health"],
            cell(r["running"]),
            cell(r["waiting"]),
            cell(r["tokens_per_s"]),
        )
        for r in rows
    ]
    widths = [max(len(str(line[i])) for line in table) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]
    lines += [f"{r['name']}: {p}" for r in rows for p in r["problems"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    rows = status.rows(args.deployment or "", ask_platform=not args.no_backend)
    print(json.dumps(rows, indent=2) if args.json else render(rows))
    return 1 if any(r["placement"] != "ok" or r["health"] != "ok" for r in rows) else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status", help="each instance on this host: placement, backend, health, load"
    )
    parser.add_argument(
        "--deployment", type=arguments.name, default=None, help="only this deployment's instances"
    )
    parser.add_argument(
        "--no-backend",
        action="store_true",
        help="do not ask vLLM its platform (a python3 in each container, seconds each)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.set_defaults(func=run)
