"""What each zenvllm instance on this host is doing: the side-effect edge of `zenvllm
status`. It reads the containers' labels (the plan), the engine's view of their
cpusets, every thread's affinity and the resident pages per node under /proc, vLLM's
own platform (asked in the container), the AMX permission the launcher obtained (its
log), /health and /metrics, and where asked the router's workers; core/observed.py
judges.
Standard library only (hosts run it as `python3 -m zenvllm.runtime status`).
"""

from __future__ import annotations

import datetime
import math
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zenvllm.core import gate, observed
from zenvllm.core.errors import UserError
from zenvllm.core.generations import cpu_name, generation
from zenvllm.core.host import ISA_FLAGS
from zenvllm.core.observed import Planned, Seen
from zenvllm.core.topology import parse_cpu_list, parse_cpuinfo
from zenvllm.runtime import amx, health
from zenvllm.runtime.engine import Cli

# vLLM's gauges and counter the view shows (its Prometheus names).
RUNNING, WAITING, TOKENS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:generation_tokens_total",
)
FIX = "is this host's engine running, and does zenvllm status run as root?"


def docker(*args: str, timeout: float = 60, both: bool = False) -> str:
    """The engine's answer (DOCKER_HOST as set), with its stderr too if `both`; a
    UserError naming the command else."""
    engine = Cli()
    command = " ".join([engine.binary, *args][:3])
    try:
        done = engine.run(*args, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired, UserError) as err:  # UserError: no binary
        raise UserError(f"{command}: {err}; {FIX}") from None
    if done.returncode != 0:
        raise UserError(f"{command}: {done.stderr.strip()[:300]}; {FIX}")
    return done.stdout + done.stderr if both else done.stdout


def containers(deployment: str) -> list[dict[str, Any]]:
    """`docker inspect` of every zenvllm container (of one deployment, if named)."""
    label = f"zenvllm.deployment={deployment}" if deployment else "zenvllm.managed=true"
    names = docker("ps", "--all", "--filter", f"label={label}", "--format", "{{.Names}}").split()
    if not names:
        return []
    found = gate.parse_json(docker("inspect", *names), "docker inspect", FIX)
    return sorted(gate.items(found, "docker inspect", FIX), key=lambda c: c.get("Name", ""))


def planned(info: dict[str, Any]) -> Planned:
    labels = info.get("Config", {}).get("Labels") or {}
    return Planned(
        name=labels.get("zenvllm.instance", info.get("Name", "?").lstrip("/")),
        target=labels.get("zenvllm.target", ""),
        cpus=frozenset(parse_cpu_list(labels.get("zenvllm.cpus", ""))),
        mems=frozenset(parse_cpu_list(labels.get("zenvllm.mems", ""))),
    )


def read_proc(path: Path) -> str | None:
    """A /proc file, or None when the process is gone or it is not ours to read."""
    try:
        return gate.read_text(path, gate.PROCFS, FIX, optional=True)
    except (gate.InputError, OSError):
        return None


def pids(pid: int) -> list[int]:
    """The container's main process and its descendants (vLLM's engine core and workers
    are children of its API server), from /proc/*/stat: any cgroup layout, v1 or v2."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        stat = read_proc(Path(f"/proc/{entry}/stat")) if entry.isdigit() else None
        fields = stat.rsplit(")", 1)[-1].split() if stat else []
        if len(fields) > 1 and fields[1].isdigit():  # state, ppid, ...
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return sorted(found)


def threads(pid: int) -> dict[str, frozenset[int]]:
    out: dict[str, frozenset[int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        status = read_proc(Path(f"/proc/{pid}/task/{tid}/status")) or ""
        name = re.search(r"^Name:\s*(.*)$", status, re.M)
        if status:
            out[f"{pid}/{tid} {name[1] if name else '?'}"] = observed.cpus_allowed(status)
    return out


def per_start(
    info: dict[str, Any],
    cache: dict[str, str] | None,
    what: str,
    ask: Callable[[dict[str, Any]], str | None],
) -> str:
    """`ask(info)`'s answer, which holds for one start of the container: asked once and
    kept in `cache` under that start (without a cache, asked each time); "" and not kept
    when `ask` has no answer (None)."""
    key = f"{info.get('Id', '')}@{info.get('State', {}).get('StartedAt', '')}{what}"
    if cache is None or key not in cache:
        answer = ask(info)
        if answer is None or cache is None:
            return answer or ""
        cache[key] = answer
    return cache[key]


def platform_of(info: dict[str, Any]) -> str | None:
    """vLLM's platform, asked in the running container (a python3 that imports vLLM:
    seconds); None when vLLM cannot be asked."""
    name = info.get("Name", "").lstrip("/")
    try:
        answer = docker("exec", name, "python3", "-c", observed.PLATFORM_CODE, timeout=120)
    except UserError:  # vLLM not importable there: no verdict, not a fallback
        return None
    return (answer.strip().splitlines() or [""])[-1]


def amx_of(info: dict[str, Any]) -> str | None:
    """The AMX tile permission the launcher obtained (its line in the container's first
    two minutes of output; the permission holds for the processes it starts); None when
    there is no such line (yet)."""
    started = re.match(
        r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", info.get("State", {}).get("StartedAt", "")
    )
    name = info.get("Name", "").lstrip("/")
    if not started or not name:
        return None
    when = datetime.datetime.fromisoformat(started[1] + "+00:00").timestamp() + 120
    try:
        return amx.verdict(docker("logs", "--until", f"{when:.0f}", name, both=True)) or None
    except UserError:
        return None


def seen(info: dict[str, Any], platforms: dict[str, str] | None) -> Seen:
    """What the container does; its platform asked unless `platforms` is None."""
    host = info.get("HostConfig", {})
    pid = int(info.get("State", {}).get("Pid") or 0)
    members = pids(pid) if pid else []
    pages: dict[int, int] = {}
    every: dict[str, frozenset[int]] = {}
    for member in members:
        every |= threads(member)
        for node, n in observed.pages_per_node(
            read_proc(Path(f"/proc/{member}/numa_maps")) or ""
        ).items():
            pages[node] = pages.get(node, 0) + n
    # Both hold for one container start: asked once per start where there is a cache.
    platform = per_start(info, platforms, "", platform_of) if pid and platforms is not None else ""
    return Seen(
        cpus=frozenset(parse_cpu_list(host.get("CpusetCpus") or "")),
        mems=frozenset(parse_cpu_list(host.get("CpusetMems") or "")),
        threads=every,
        pages=pages,
        platform=platform,
        amx=per_start(info, platforms, " amx", amx_of) if pid else "",
    )


def listen(info: dict[str, Any]) -> tuple[str, int]:
    """Where vLLM listens: its --host and --port arguments (labels for the port); a
    headless stage of a copy cut over hosts serves nothing itself: its group's head."""
    args = " ".join(info.get("Args") or [])
    flag = "--master-addr" if "--headless" in (info.get("Args") or []) else "--host"
    host = re.search(flag + r"[= ](\S+)", args)
    port = (info.get("Config", {}).get("Labels") or {}).get("zenvllm.port", "0")
    return (host[1] if host else "127.0.0.1"), int(port) if port.isdigit() else 0


def stage(info: dict[str, Any]) -> str:
    """ "r/p" for stage r of a copy cut over p hosts (0 is the head), "" for a whole copy."""
    args = " ".join(info.get("Args") or [])
    hosts, rank = (re.search(f + r"[= ](\d+)", args) for f in ("--nnodes", "--node-rank"))
    return f"{rank[1] if rank else 0}/{hosts[1]}" if hosts and int(hosts[1]) > 1 else ""


def metrics(host: str, port: int) -> tuple[dict[str, float], str]:
    """vLLM's gauges and counter the view shows, summed over their labels ({} if none),
    and the model it serves (the series' model_name label; "" if none)."""
    where = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{where}:{port}/metrics", timeout=3) as reply:
            text = reply.read(8 * gate.MIB).decode("utf-8", "replace")
    except OSError:
        return {}, ""
    out: dict[str, float] = {}
    model = ""
    for name, labels, value in re.findall(
        r"^([a-z_:]+)(?:\{([^}]*)\})? ([0-9.eE+-]+)$", text, re.M
    ):
        try:
            number = float(value)
        except ValueError:  # "1.2.3" fits the pattern, not a number: not vLLM's
            continue
        if name in (RUNNING, WAITING, TOKENS) and math.isfinite(number):
            out[name] = out.get(name, 0.0) + number
            model = model or (re.findall(r'model_name="([^"]{1,200})"', labels) or [""])[0]
    return out, model


def workers(router: str) -> dict[str, bool]:
    """The router's workers (vllm-router's /workers): each URL and whether it counts it
    healthy."""
    fix = "give --router the URL the router listens on (zenvllm_router_listen)"
    if not re.match(r"https?://[^\s/]+(/\S*)?$", router):
        raise UserError(f"--router {router!r} is not an http:// or https:// URL; {fix}")
    try:
        with urllib.request.urlopen(f"{router.rstrip('/')}/workers", timeout=5) as reply:
            text = reply.read(gate.MIB).decode("utf-8", "replace")
    except OSError as err:
        raise UserError(f"--router {router}: {err}; {fix}") from None
    return observed.router_view(gate.parse_json(text, f"--router {router}/workers", fix), fix)


def this_cpu(root: Path = Path("/")) -> dict[str, object]:
    """This host's CPU as its plan names it: the brand string with the generation (which
    KVM's often lacks) and the ISA flags the planner reads."""
    text = gate.read_text(root / "proc" / "cpuinfo", gate.PROCFS, FIX, optional=True)
    info = parse_cpuinfo(text or "")
    gen = generation(info.vendor, info.family, info.model)
    return {
        "cpu": cpu_name(info.model_name, gen, info.family, info.model),
        "generation": gen,
        "isa": sorted(info.flags & frozenset(ISA_FLAGS)),
    }


def rows(
    deployment: str = "", platforms: dict[str, str] | None = None, interval: float = 1.0
) -> list[dict[str, Any]]:
    """One row per instance: the plan, what runs, and the verdict; vLLM's platform
    asked (and kept in `platforms`, by container start) unless it is None."""
    found = containers(deployment)
    cpu = this_cpu() if found else {}
    before = {c["Id"]: metrics(*listen(c))[0] for c in found}
    time.sleep(interval if found else 0)
    out = []
    for info in found:
        plan, now = planned(info), seen(info, platforms)
        host, port = listen(info)
        after, model = metrics(host, port)
        start = before[info["Id"]].get(TOKENS)
        running = info.get("State", {}).get("Running", False)
        problems = observed.problems(plan, now) if running else ["not running"]
        labels = info.get("Config", {}).get("Labels") or {}
        part = stage(info)
        if part and not part.startswith("0/"):
            after, start = {}, None  # its group's figures are its head's, counted there
        out.append(
            {
                "host": socket.gethostname(),
                **cpu,
                "deployment": labels.get("zenvllm.deployment", ""),
                "id": info.get("Id", ""),
                "name": plan.name,
                "stage": part,
                "target": plan.target,
                "model": model,
                "cpus": sorted(now.cpus),
                "planned_cpus": sorted(plan.cpus),
                "node": sorted(plan.mems),
                "backend": observed.backend(now.platform) if now.platform else "",
                "platform": now.platform,
                "amx": now.amx,
                "placement": "ok" if not problems else "drifted",
                "problems": problems,
                "numa_local_ratio": observed.local_ratio(now.pages, plan.mems),
                "health": "ok" if running and health.probe(port, host=host) is None else "down",
                "running": after.get(RUNNING),
                "waiting": after.get(WAITING),
                "tokens_per_s": (
                    round((after[TOKENS] - start) / interval, 1)
                    if start is not None and TOKENS in after and interval > 0
                    else None
                ),
                "url": f"http://{host}:{port}",
                "router": None,  # "healthy", "unhealthy" or "not listed", once asked
            }
        )
    return out
