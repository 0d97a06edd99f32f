"""What a running instance really does, against what its plan said: pure verdicts.

The plan is checked once when the launcher starts vLLM; after that an instance can
drift: its container moved to other CPUs (`docker update --cpuset-cpus`), a thread
bound outside its cpuset (vllm#58033), memory landed on another node (vllm#43240), or
vLLM silently fell back to its stock CPU platform. `runtime/status.py` reads the
container, /proc and the server; the verdicts are decided here. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from zenvllm.core import gate
from zenvllm.core.topology import format_cpu_list, parse_cpu_list

# Resident pages on the planned node below this share: memory is on the wrong node.
LOCAL_MIN = 0.9
# How to ask vLLM, inside its container, which platform it selected.
PLATFORM_CODE = "from vllm.platforms import current_platform as p; print(type(p).__name__)"
# vLLM's platform class per image target: what `current_platform` is when it accelerates.
PLATFORMS = {"vllm-openai": "CpuPlatform", "zen": "ZenCpuPlatform", "pace": "PacePlatform"}
BACKENDS = {"CpuPlatform": "stock", "ZenCpuPlatform": "zentorch", "PacePlatform": "pace"}


@dataclass(frozen=True)
class Planned:
    """What the deployment planned for one instance (its container's labels)."""

    name: str
    target: str
    cpus: frozenset[int]
    mems: frozenset[int]


@dataclass(frozen=True)
class Seen:
    """What the instance does now."""

    cpus: frozenset[int]  # the container's cpuset
    mems: frozenset[int]
    threads: dict[str, frozenset[int]] = field(default_factory=dict)  # "pid/tid comm": CPUs
    pages: dict[int, int] = field(default_factory=dict)  # resident pages per NUMA node
    platform: str = ""  # vLLM's current_platform class ("" = not asked)
    amx: str = ""  # the launcher's AMX permission: granted, refused, none, ... ("" = unknown)


def cpus_allowed(status: str) -> frozenset[int]:
    """/proc/PID/task/TID/status's Cpus_allowed_list."""
    found = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
    return frozenset(parse_cpu_list(found[1])) if found else frozenset()


def pages_per_node(numa_maps: str) -> dict[int, int]:
    """Resident pages per node, summed over every mapping of /proc/PID/numa_maps."""
    pages: dict[int, int] = {}
    for node, count in re.findall(r"\bN(\d+)=(\d+)\b", numa_maps):
        pages[int(node)] = pages.get(int(node), 0) + int(count)
    return pages


def local_ratio(pages: dict[int, int], mems: frozenset[int]) -> float | None:
    """The share of resident pages on the planned nodes; None before any is counted."""
    total = sum(pages.values())
    return sum(n for node, n in pages.items() if node in mems) / total if total else None


def backend(platform: str) -> str:
    return BACKENDS.get(platform, platform or "unknown")


def listed(ids: frozenset[int]) -> str:
    """A cpuset as the kernel lists it; an empty one restricts nothing."""
    return format_cpu_list(ids) or "unrestricted"


def problems(planned: Planned, seen: Seen) -> list[str]:
    """Every way the instance differs from its plan, each naming the values ([] = none)."""
    out = []
    if seen.cpus != planned.cpus:
        out.append(
            f"cpuset {listed(seen.cpus)} is not the planned "
            f"{format_cpu_list(planned.cpus)} (moved after launch?)"
        )
    if seen.mems != planned.mems:
        out.append(
            f"memory nodes {listed(seen.mems)} are not the planned {format_cpu_list(planned.mems)}"
        )
    outside = {t: c for t, c in seen.threads.items() if not c <= planned.cpus}
    if outside:
        thread, cpus = sorted(outside.items())[0]
        out.append(
            f"{len(outside)} thread(s) may run outside the planned CPUs "
            f"{format_cpu_list(planned.cpus)}, e.g. {thread} on {format_cpu_list(cpus)}"
        )
    ratio = local_ratio(seen.pages, planned.mems)
    if ratio is not None and ratio < LOCAL_MIN:
        out.append(
            f"{ratio:.0%} of resident memory is on node {format_cpu_list(planned.mems)} "
            f"(below {LOCAL_MIN:.0%}): memory landed on another node"
        )
    if seen.amx == "refused":
        out.append(
            "AMX tile permission refused at launch: vLLM's AMX kernels die with 'Illegal "
            "instruction' (its log says why)"
        )
    wanted = PLATFORMS.get(planned.target, "")
    if seen.platform and wanted and seen.platform != wanted:
        out.append(
            f"vLLM runs {seen.platform} ({backend(seen.platform)}), not the "
            f"{planned.target} target's {wanted}: a silent fallback"
        )
    return out


def router_view(answer: object, fix: str) -> dict[str, bool]:
    """vllm-router's /workers answer ({"workers": [{"url", "is_healthy", ...}]}) as each
    worker URL and whether the router counts it healthy."""
    where = "the router's /workers answer"
    found = gate.items(gate.obj(answer, where, fix).get("workers"), f"{where}'s workers", fix)
    view = {}
    for i, worker in enumerate(found):
        at = f"{where}'s workers[{i}]"
        url = gate.text(gate.obj(worker, at, fix).get("url"), f"{at}.url", fix)
        view[url.rstrip("/")] = worker.get("is_healthy") is True
    return view


def in_router(url: str, view: dict[str, bool]) -> str:
    """Whether the router sends this instance requests: healthy, unhealthy, not listed."""
    if url not in view:
        return "not listed"
    return "healthy" if view[url] else "unhealthy"
