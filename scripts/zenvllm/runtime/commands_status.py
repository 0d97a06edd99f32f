"""`zenvllm status`: one line per instance on this host: where it runs against its
plan, which backend vLLM selected, its health and load. Exit 1 when one has drifted
or is down (a check a timer or a playbook can run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from zenvllm.core import arguments, gate
from zenvllm.core.errors import UserError
from zenvllm.core.topology import format_cpu_list
from zenvllm.runtime import status
from zenvllm.runtime.atomic import write_atomically

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
            cell(r["backend"]),
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


# Prometheus' exposition of the rows: node_exporter's textfile collector serves it.
GAUGES = (
    (
        "zenvllm_placement_ok",
        "1 when the instance runs as planned: cpuset, memory nodes, "
        "thread affinity, memory locality and backend",
        lambda r: r["placement"] == "ok",
    ),
    (
        "zenvllm_placement_problems",
        "How many ways the instance differs from its plan",
        lambda r: len(r["problems"]),
    ),
    (
        "zenvllm_numa_local_ratio",
        "Share of the instance's resident memory on its planned node",
        lambda r: r["numa_local_ratio"],
    ),
    (
        "zenvllm_instance_healthy",
        "1 when the instance answers /health",
        lambda r: r["health"] == "ok",
    ),
)


def quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(rows: list[dict]) -> str:
    """The rows as Prometheus metrics, one series per instance; vLLM's backend as an
    info metric whose labels say what ran against what the target wanted."""
    out = []
    for name, text, value in GAUGES:
        out += [f"# HELP {name} {text}.", f"# TYPE {name} gauge"]
        for r in rows:
            if (v := value(r)) is not None:
                out.append(f"{name}{{{series(r)}}} {float(v):g}")
    out += [
        "# HELP zenvllm_backend_info The backend vLLM selected (asked in the running container).",
        "# TYPE zenvllm_backend_info gauge",
    ]
    for r in rows:
        if r["platform"]:
            extra = f'backend="{quoted(r["backend"])}",platform="{quoted(r["platform"])}"'
            out.append(f"zenvllm_backend_info{{{series(r)},{extra}}} 1")
    return "\n".join(out) + "\n"


def series(row: dict) -> str:
    keys = (
        ("deployment", row["deployment"]),
        ("zenvllm_instance", row["name"]),
        ("target", row["target"]),
    )
    return ",".join(f'{k}="{quoted(v)}"' for k, v in keys)


def write_textfile(path: Path, text: str) -> None:
    """Replace the file in one rename, only if it is one this wrote (by its first line)."""
    there = gate.read_text(path, gate.SMALL, "name a file of its own", optional=True)
    if there is not None and not there.startswith(text.split("\n", 1)[0]):
        raise UserError(
            f"--textfile {path}: the file there is not one zenvllm status wrote; name a "
            "file of its own (e.g. zenvllm.prom in the collector's directory)"
        )
    write_atomically(path, text)


# The platform cache's own key: a file without it is not one this wrote.
CACHE_MARK = {"#": "zenvllm status: vLLM's platform per container start"}


def platforms(path: Path | None) -> dict[str, str]:
    """The platforms asked before, by container start (--platform-cache); a file there
    that this did not write is refused, never read as a cache or replaced."""
    if path is None:
        return {}
    fix = "name a file of its own (zenvllm status writes it)"
    found = gate.read_json(path, gate.SMALL, fix, optional=True)
    if found is None:
        return {}
    ours = isinstance(found, dict) and found.get("#") == CACHE_MARK["#"]
    if not ours or not all(isinstance(v, str) for v in found.values()):
        raise UserError(
            f"--platform-cache {path}: not a platform cache zenvllm status wrote; {fix}"
        )
    return {k: v for k, v in found.items() if k != "#"}


def run(args: argparse.Namespace) -> int:
    cache = None if args.no_backend else platforms(args.platform_cache)
    rows = status.rows(args.deployment or "", cache)
    if args.platform_cache and cache is not None:
        live = {k: v for k, v in cache.items() if any(k.startswith(r["id"]) for r in rows)}
        write_atomically(args.platform_cache, json.dumps(CACHE_MARK | live, indent=1) + "\n")
    if args.textfile:
        write_textfile(args.textfile, exposition(rows))
    else:
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
    parser.add_argument(
        "--platform-cache",
        type=Path,
        help="keep each container's platform here and ask vLLM again only after a restart "
        "(for a timer: asking starts a python3 in the container)",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the rows as JSON")
    out.add_argument(
        "--textfile",
        type=Path,
        help="write them as Prometheus metrics to this file instead (node_exporter's "
        "textfile collector: a *.prom file in its directory), replaced in one rename",
    )
    parser.set_defaults(func=run)
