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
import urllib.request
from pathlib import Path

from zenvllm.core import gate
from zenvllm.image.engine import DOCKER

PROFILE_MOUNT = "/profile"
# Idle until /start_profile; no Python stacks (smaller traces), the API server left out.
PROFILER_CONFIG = {
    "profiler": "torch",
    "torch_profiler_dir": PROFILE_MOUNT,
    "torch_profiler_with_stack": False,
    "ignore_frontend": True,
}
PLATFORM_CODE = "from vllm.platforms import current_platform as p; print(type(p).__name__)"
# Which platform each image target wants, and the operator namespace that proves it ran.
WANTED = {"zen": ("ZenCpuPlatform", "zentorch::"), "pace": ("PacePlatform", "pace::")}
TOP = 8  # operators kept per server, by self CPU time


def serve_args() -> list[str]:
    """`vllm serve` arguments enabling the profiler, writing to PROFILE_MOUNT."""
    return [f"--profiler-config={json.dumps(PROFILER_CONFIG, separators=(',', ':'))}"]


def parse_table(text: str) -> list[dict]:
    """Rows of torch's key_averages table: operator, self CPU %, calls."""
    rows = []
    for line in text.splitlines():
        fields = re.split(r"\s{2,}", line.strip())
        if len(fields) < 7 or not fields[-1].isdigit() or not fields[1].endswith("%"):
            continue
        rows.append(
            {"op": fields[0], "self_cpu_pct": float(fields[1][:-1]), "calls": int(fields[-1])}
        )
    return sorted(rows, key=lambda r: -r["self_cpu_pct"])


def verdict(target: str, platform: str, rows: list[dict]) -> dict:
    """The record of one server: its platform, its top operators, the target's own
    operators' calls, and whether the target's acceleration really ran."""
    wanted, namespace = WANTED.get(target, ("", ""))
    calls = sum(r["calls"] for r in rows if namespace and r["op"].startswith(namespace))
    record = {"platform": platform, "top_ops": rows[:TOP]}
    if wanted:
        record |= {"accelerated_calls": calls, "active": platform == wanted and calls > 0}
    return record


def describe(name: str, target: str, record: dict) -> str:
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


def post(url: str, body: dict | None = None, timeout: float = 300) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.read(1 << 20)


def profile(url: str, model: str, host_dir: Path) -> list[dict]:
    """One short request under vLLM's profiler; the table its worker wrote."""
    post(f"{url}/start_profile")
    try:
        body = {"model": model, "prompt": "Hello", "max_tokens": 16, "ignore_eos": True}
        post(f"{url}/v1/completions", body)
    finally:
        post(f"{url}/stop_profile")
    tables = sorted(host_dir.glob("*profiler_out*.txt"))
    fix = "the profiler's table is missing; see the server's log"
    return parse_table(gate.read_text(tables[0], gate.SMALL, fix) or "") if tables else []


def read_back(container: str, url: str, model: str, target: str, host_dir: Path) -> dict:
    return verdict(target, platform_of(container), profile(url, model, host_dir))
