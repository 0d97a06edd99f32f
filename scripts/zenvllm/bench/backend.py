"""What vLLM really ran in a bench server, read back from it, not predicted.

The platform: vLLM's own `current_platform`, asked inside the running container
(its image, env and cpuset; the same rule its processes followed at start). The
kernels: vLLM's torch profiler around one short request (`/start_profile`,
`/stop_profile`, enabled by `--profiler-config` and idle until then), whose table
names every operator that executed and how often. A zen configuration is zen only
when the platform is ZenCpuPlatform and zentorch's operators ran.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zenvllm.bench import catalogue, http_client, layouts
from zenvllm.bench.layouts import Configuration
from zenvllm.core import gate
from zenvllm.core.observed import PLATFORM_CODE, PLATFORMS
from zenvllm.runtime import warm_start
from zenvllm.runtime.engine import DOCKER

PROFILE_MOUNT = "/profile"
# Idle until /start_profile; no Python stacks (smaller traces), the API server left out.
PROFILER_CONFIG = {
    "profiler": "torch",
    "torch_profiler_dir": PROFILE_MOUNT,
    "torch_profiler_with_stack": False,
    "ignore_frontend": True,
}
# Which platform each image target wants, and the operator namespace that proves it ran.
WANTED = {t: (PLATFORMS[t], ns) for t, ns in (("zen", "zentorch::"), ("pace", "pace::"))}
TOP = 8  # operators kept per server, by self CPU time


def serve_args() -> list[str]:
    """`vllm serve` arguments enabling the profiler, writing to PROFILE_MOUNT."""
    return [f"--profiler-config={json.dumps(PROFILER_CONFIG, separators=(',', ':'))}"]


UNITS_US = {"us": 1.0, "ms": 1e3, "s": 1e6}


def micros(text: str) -> float:
    """ "2.312ms" -> 2312.0 (torch's table prints us, ms or s)."""
    found = re.fullmatch(r"([0-9.]+)(us|ms|s)", text)
    if found is None:
        raise ValueError(f"{text!r} is not a time torch's profiler prints (us, ms or s)")
    number, unit = found.groups()
    return round(float(number) * UNITS_US[unit], 3)


def parse_table(text: str) -> list[dict[str, Any]]:
    """Rows of torch's key_averages table: operator, self CPU %, CPU time per call, calls."""
    rows = []
    for line in text.splitlines():
        fields = re.split(r"\s{2,}", line.strip())
        if len(fields) < 7 or not fields[-1].isdigit() or not fields[1].endswith("%"):
            continue
        try:
            avg = micros(fields[-2])
        except AttributeError:  # not a time: not a row
            continue
        rows.append(
            {
                "op": fields[0],
                "self_cpu_pct": float(fields[1][:-1]),
                "avg_us": avg,
                "calls": int(fields[-1]),
            }
        )
    return sorted(rows, key=lambda r: -r["self_cpu_pct"])


def verdict(target: str, platform: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The record of one server: its platform, its top operators, the target's own
    operators' calls, and whether the target's acceleration really ran."""
    wanted, namespace = WANTED.get(target, ("", ""))
    calls = sum(r["calls"] for r in rows if namespace and r["op"].startswith(namespace))
    record: dict[str, Any] = {"platform": platform, "top_ops": rows[:TOP]}
    if wanted:
        record |= {"accelerated_calls": calls, "active": platform == wanted and calls > 0}
    return record


def describe(name: str, target: str, record: dict[str, Any]) -> str:
    """One line for the notes: what ran, in words."""
    top = ", ".join(f"{r['op']} x{r['calls']}" for r in record["top_ops"][:3]) or "no table"
    if "active" not in record:
        return f"{name}: vLLM selected {record['platform']}; busiest operators {top}"
    state = "active" if record["active"] else "INACTIVE: not presented as " + target
    return (
        f"{name}: vLLM selected {record['platform']}; {target} {state} "
        f"({record['accelerated_calls']} calls of its operators in one profiled request; "
        f"busiest {top})"
    )


# -- the thin edges: the container and its HTTP endpoints -----------------------------
def platform_of(container: str) -> str:
    done = DOCKER.run("exec", container, "python", "-c", PLATFORM_CODE, timeout=300)
    words = done.stdout.split()
    return words[-1] if done.returncode == 0 and words else f"unknown ({done.stderr[-200:]!r})"


def profile(url: str, model: str, host_dir: Path) -> list[dict[str, Any]]:
    """One short request under vLLM's profiler; the table its worker wrote."""
    http_client.post(f"{url}/start_profile")
    try:
        body = {"model": model, "prompt": "Hello", "max_tokens": 16, "ignore_eos": True}
        http_client.post(f"{url}/v1/completions", body)
    finally:
        http_client.post(f"{url}/stop_profile")
    tables = sorted(host_dir.glob("*profiler_out*.txt"))
    fix = "the profiler's table is missing; see the server's log"
    return parse_table(gate.read_text(tables[0], gate.SMALL, fix) or "") if tables else []


def read_back(container: str, url: str, model: str, target: str, host_dir: Path) -> dict[str, Any]:
    return verdict(target, platform_of(container), profile(url, model, host_dir))


# -- how a server started: its compile cache, and a restart ---------------------------
def cache_state(dirs: tuple[str, ...]) -> str:
    """ "warm" when the compile cache a server mounts holds Inductor's artifacts already
    (the launcher's own count), "cold" when it is empty, "none" when the bench keeps no
    cache. Asked before the servers start: they begin filling it at once."""
    if not dirs:
        return "none"
    return "warm" if any(warm_start.artifacts(Path(d))[0] for d in dirs) else "cold"


Wait = Callable[[list[tuple[str, int]]], float]  # the bench's wait for /health


def restart(name: str, port: int, wait: Wait) -> float:
    """`docker restart` of a ready server; seconds until /health answers again."""
    start = time.monotonic()
    DOCKER.run("restart", name, check=True, timeout=300)
    wait([(name, port)])
    return time.monotonic() - start


# -- one configuration's record -----------------------------------------------------------
def profile_dir(raw: Path, config: str, server: str) -> Path:
    """Where vLLM's profiler of one server writes (the container's user writes it)."""
    path = raw / f"{config}-{server}-profile"
    path.mkdir(exist_ok=True)
    path.chmod(0o777)
    return path


def facts(
    config: Configuration,
    raw: Path,
    started: dict[str, Any],
    restart_once: bool,
    wait: Wait,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """What the first server of a vLLM configuration ran (its platform; for the
    planner's containers the operators of one profiled request) and how it started;
    the planner's layout is restarted once for its warm time to ready."""
    if config.kind not in ("plan", "stock", *catalogue.RANK_FLAGS) or not config.servers:
        return {}
    first = config.servers[0]
    if first.instance:
        url, where = f"http://127.0.0.1:{first.port}", profile_dir(raw, config.name, first.name)
        found = read_back(first.name, url, layouts.MODEL_MOUNT, config.target, where)
    else:
        found = verdict(config.target, platform_of(first.name), [])
    say(describe(config.name, config.target, found))
    record = {"backend": found, "start": started}
    if restart_once and config.name == catalogue.PLANNER:
        took = restart(first.name, first.port, wait)
        cache = "none" if started["compile_cache"] == "none" else "warm"  # it just compiled
        record["restart"] = {"ready_s": round(took, 1), "compile_cache": cache}
        say(f"{config.name}: restarted, ready again in {took:.0f} s")
    return record
