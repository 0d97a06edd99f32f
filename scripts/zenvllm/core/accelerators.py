"""What the image's accelerators will do on this CPU: zentorch (zen), pace-vllm (pace)
and vLLM's own platform choice, each with the reason, for the launcher's log.

Pure functions over the Host and installed versions (found without importing torch);
standard library only, as the launcher runs before vLLM's imports.
"""

from __future__ import annotations

import re
from importlib import metadata

from zenvllm.core.host import Host
from zenvllm.core.targets import TARGETS, missing_isa


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version: '2.13.0+cpu' -> (2, 13, 0)."""
    nums = re.findall(r"\d+", version.split("+")[0])
    return tuple(int(n) for n in nums)


def zentorch_state(host: Host, zentorch: str | None, torch: str | None) -> tuple[bool, str]:
    """Whether zentorch will accelerate this container, and why or why not."""
    if zentorch is None:
        return False, "zentorch is not installed (build the zen target)"
    lacks = missing_isa(TARGETS["zen"], host)
    if lacks:
        return False, (
            f"zentorch {zentorch} is installed but INACTIVE: this CPU lacks "
            f"{', '.join(lacks)}; vLLM runs its default CPU platform (oneDNN kernels), "
            "as the vllm-openai image would"
        )
    # zentorch X.Y.* is built against torch X.Y and refuses any other.
    if torch is None or release(zentorch)[:2] != release(torch)[:2]:
        return False, (
            f"zentorch {zentorch} is installed but INACTIVE: it needs torch "
            f"{'.'.join(map(str, release(zentorch)[:2]))}.x, found torch {torch}"
        )
    flags = ", ".join(TARGETS["zen"].needs_flags)
    return True, (
        f"zentorch {zentorch} is ACTIVE: {host.vendor} with {flags}; "
        "vLLM will select its ZenCpuPlatform (ZenDNN kernels for linear layers)"
    )


def in_range(version: str, spec: str) -> bool:
    """A small subset of PEP 440 specifiers (>=, <=, >, <, ==) over numeric releases."""
    ops = {
        ">=": lambda a, b: a >= b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        "<": lambda a, b: a < b,
        "==": lambda a, b: a == b,
    }
    have = release(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op = next(o for o in (">=", "<=", "==", ">", "<") if clause.startswith(o))
        want = release(clause[len(op) :])
        width = max(len(have), len(want))
        a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        if not ops[op](a, b):
            return False
    return True


def pace_state(host: Host, pace: str | None, vllm: str | None, spec: str) -> tuple[bool, str]:
    if pace is None:
        return False, "pace-vllm is not installed (build the pace target)"
    if vllm is None or not in_range(vllm, spec):
        return False, f"pace-vllm {pace} is INACTIVE: it supports vLLM {spec}, found {vllm}"
    lacks = missing_isa(TARGETS["pace"], host)
    if lacks:
        return (
            False,
            f"pace-vllm {pace} is installed but INACTIVE: this CPU lacks {', '.join(lacks)}",
        )
    return True, f"pace-vllm {pace} is ACTIVE: vLLM {vllm} with PACE's platform plugin"


def vllm_picks_zen(host: Host, zentorch: str | None) -> bool:
    """vLLM's own rule: AuthenticAMD and any avx512 flag in /proc/cpuinfo, and zentorch."""
    return (
        zentorch is not None
        and host.vendor == TARGETS["zen"].needs_vendor
        and any(f.startswith("avx512") for f in host.flags)
    )


def platform_line(host: Host, zen_platform: bool, pace_active: bool) -> str:
    kernels = "AVX-512" if "avx512f" in host.flags else "AVX2"
    if pace_active:
        return f"vLLM platform: PACE (pace-vllm plugin) on {kernels} kernels"
    if zen_platform:
        return f"vLLM platform: ZenCpuPlatform (cpu + zentorch) on {kernels} kernels"
    return f"vLLM platform: CpuPlatform (cpu) with its {kernels} kernels"
