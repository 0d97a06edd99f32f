"""`zenvllm status`: one line per instance on this host: where it runs against its
plan, which backend vLLM selected, its health, whether the router sends it requests,
and its load. Exit 1 when one has drifted, is down or is out of the router (a check a
timer or a playbook can run). `--from` renders the rows several hosts printed with
`--json` as one table: the status playbook's fleet view."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from zenvllm.core import arguments, gate, observed, revisions
from zenvllm.core.errors import UserError
from zenvllm.core.topology import format_cpu_list
from zenvllm.runtime import revisions as revision_files
from zenvllm.runtime import status
from zenvllm.runtime.atomic import write_atomically

COLUMNS = (
    "host",
    "name",
    "cpus",
    "node",
    "backend",
    "placement",
    "health",
    "router",
    "run",
    "wait",
    "tok/s",
)


def cell(value: object) -> str:
    return (
        "-"
        if value is None or value == ""
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def cpus(rows: list[dict[str, Any]]) -> list[str]:
    """Each host's CPU, once: its generation and ISA say what speed to expect."""
    seen = {r["host"]: r for r in rows if r.get("cpu")}
    return [f"{h}: {r['cpu']}; {' '.join(r.get('isa') or ['no AVX2'])}" for h, r in seen.items()]


def revision_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Each host's revision of each deployment, once (the rows that carry one)."""
    seen = {(r["host"], r.get("deployment", "")): r["revision"] for r in rows if r.get("revision")}
    return [f"{host} {deployment}: {text}" for (host, deployment), text in seen.items()]


def with_revisions(rows: list[dict[str, Any]], root: Path) -> list[dict[str, Any]]:
    """Each row with the revision its deployment serves on this host, as
    `zenvllm revision list` summarises it ("" where none is kept)."""
    serving = {}
    for deployment in {r.get("deployment", "") for r in rows}:
        live = revisions.serving(revision_files.on_disk(root / deployment)) if deployment else None
        serving[deployment] = live.summary() if live else ""
    return [r | {"revision": serving[r.get("deployment", "")]} for r in rows]


def render(rows: list[dict[str, Any]]) -> str:
    """Each host's CPU, the table, then each drifted instance's problems."""
    if not rows:
        return "no zenvllm instances"
    table = [COLUMNS] + [
        (
            r["host"],
            r["name"] + (f" ({r['stage']})" if r.get("stage") else ""),
            observed.listed(frozenset(r["cpus"])),
            format_cpu_list(r["node"]),
            cell(r["backend"]),
            r["placement"],
            r["health"],
            cell(r["router"]),
            cell(r["running"]),
            cell(r["waiting"]),
            cell(r["tokens_per_s"]),
        )
        for r in rows
    ]
    widths = [max(len(str(line[i])) for line in table) for i in range(len(COLUMNS))]
    lines = (
        cpus(rows)
        + revision_lines(rows)
        + [
            "  ".join(str(v).ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
            for line in table
        ]
    )
    # Instances of several hosts may share a name: each problem then names its host.
    several = len({r["host"] for r in rows}) > 1
    who = (lambda r: f"{r['host']} {r['name']}") if several else (lambda r: r["name"])
    lines += [f"{who(r)}: {p}" for r in rows for p in r["problems"]]
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
    (
        "zenvllm_amx_granted",
        "1 when the launcher was granted AMX tiles, 0 when refused (CPUs with AMX only)",
        lambda r: {"granted": 1, "refused": 0}.get(r.get("amx", "")),
    ),
)


def quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(rows: list[dict[str, Any]]) -> str:
    """The rows as Prometheus metrics, one series per instance; vLLM's backend as an
    info metric whose labels say what ran against what the target wanted."""
    out = []
    for name, text, value in GAUGES:
        out += [f"# HELP {name} {text}.", f"# TYPE {name} gauge"]
        for r in rows:
            if (v := value(r)) is not None:
                out.append(f"{name}{{{series(r)}}} {float(v):g}")
    out += [
        "# HELP zenvllm_host_info The host's CPU: brand with generation, and ISA flags.",
        "# TYPE zenvllm_host_info gauge",
    ]
    for r in {r["host"]: r for r in rows if r.get("cpu")}.values():
        labels = {"cpu": r["cpu"], "generation": r["generation"], "isa": " ".join(r["isa"])}
        out.append(
            "zenvllm_host_info{" + ",".join(f'{k}="{quoted(v)}"' for k, v in labels.items()) + "} 1"
        )
    out += [
        "# HELP zenvllm_backend_info The backend vLLM selected (asked in the running container).",
        "# TYPE zenvllm_backend_info gauge",
    ]
    for r in rows:
        if r["platform"]:
            extra = f'backend="{quoted(r["backend"])}",platform="{quoted(r["platform"])}"'
            out.append(f"zenvllm_backend_info{{{series(r)},{extra}}} 1")
    return "\n".join(out) + "\n"


def series(row: dict[str, Any]) -> str:
    """The instance's labels; model_name and vllm_instance (vLLM's scrape address) are
    those of vLLM's own series, so a dashboard filters both alike."""
    keys = (
        ("deployment", row["deployment"]),
        ("zenvllm_instance", row["name"]),
        ("target", row["target"]),
        ("model_name", row["model"]),
        ("vllm_instance", row["url"].split("//", 1)[-1]),
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


# The platform cache's own key: a file without it is not one this wrote. (It keeps the
# AMX verdict per start too, under "<start> amx"; the mark's words stay, or every cache
# written before would be refused as foreign.)
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


# What --from needs of each row (as --json prints them), each checked before it is shown.
FIELDS = {
    "host": str,
    "name": str,
    "url": str,
    "backend": str,
    "placement": str,
    "health": str,
    "cpus": list,
    "node": list,
    "problems": list,
}


def rows_from(path: Path) -> tuple[list[dict[str, Any]], dict[str, bool] | None]:
    """The rows of several hosts and the router's /workers answer, as the status
    playbook gathers them: {"rows": [...], "workers": {...} or null}."""
    fix = "give --from the file the status playbook writes (rows from `status --json`)"
    found = gate.obj(gate.read_json(path, gate.DOCUMENT, fix), f"--from {path}", fix)
    out = []
    for i, row in enumerate(gate.items(found.get("rows"), f"--from {path}: rows", fix)):
        where = f"--from {path}: rows[{i}]"
        gate.obj(row, where, fix)
        for key, kind in FIELDS.items():
            if not isinstance(row.get(key), kind):
                raise gate.InputError(f"{where}.{key} is {gate.shown(row.get(key))}; {fix}")
        for key in ("cpus", "node"):
            for cpu in row[key]:
                gate.whole(cpu, f"{where}.{key}", 0, 1 << 20, fix)
        for key in ("running", "waiting", "tokens_per_s"):
            if row.get(key) is not None:
                gate.number(row[key], f"{where}.{key}", -1, 1e12, fix)
        for key, kind in (("cpu", str), ("generation", str), ("isa", list)):
            if key in row and not isinstance(row[key], kind):
                raise gate.InputError(f"{where}.{key} is {gate.shown(row[key])}; {fix}")
        if not all(isinstance(flag, str) for flag in row.get("isa", [])):
            raise gate.InputError(f"{where}.isa is {gate.shown(row['isa'])}; {fix}")
        shown = ("router", "running", "waiting", "tokens_per_s")
        out.append(dict.fromkeys(shown) | row)
    answer = found.get("workers")
    return out, None if answer is None else observed.router_view(answer, fix)


def run(args: argparse.Namespace) -> int:
    if args.from_file and args.textfile:
        raise UserError("--from shows other hosts' rows; --textfile is each host's own (drop one)")
    if args.from_file:
        rows, view = rows_from(args.from_file)
    else:
        cache = None if args.no_backend else platforms(args.platform_cache)
        rows, view = with_revisions(status.rows(args.deployment or "", cache), args.revisions), None
        if args.platform_cache and cache is not None:
            live = {k: v for k, v in cache.items() if any(k.startswith(r["id"]) for r in rows)}
            write_atomically(args.platform_cache, json.dumps(CACHE_MARK | live, indent=1) + "\n")
    if args.router:
        view = status.workers(args.router)
    if view is not None:
        rows = [r | {"router": observed.in_router(r["url"], view)} for r in rows]
    if args.textfile:
        write_textfile(args.textfile, exposition(rows))
    else:
        print(json.dumps(rows, indent=2) if args.json else render(rows))
    ok = ("ok", "ok", None), ("ok", "ok", "healthy")
    return 0 if all((r["placement"], r["health"], r["router"]) in ok for r in rows) else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    parser.add_argument(
        "--router",
        metavar="URL",
        help="also ask vLLM's router there (zenvllm_router_listen, e.g. http://127.0.0.1:30000) "
        "whether it sends each instance requests",
    )
    parser.add_argument(
        "--from",
        dest="from_file",
        type=Path,
        metavar="FILE",
        help="show the rows of several hosts (their `--json`) and the router's workers, as "
        "the status playbook gathers them, instead of this host's",
    )
    parser.add_argument(
        "--revisions",
        type=Path,
        default=Path(revisions.ROOT),
        metavar="DIR",
        help="where each deployment's revisions are kept, one directory per deployment "
        "(default %(default)s: the instances role's)",
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
