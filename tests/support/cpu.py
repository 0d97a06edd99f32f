"""What this machine's CPU is, for tests that must derive their expectation from it.

The CPU behind the test machines changes (AMD Zen 3, Zen 4, Intel with AMX): a test
asks these instead of assuming a vendor or an ISA.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from zenvllm.core.host import Host
from zenvllm.core.topology import read_host

REAL_CPUINFO = "real-cpuinfo"  # the AVX2 view's copy of the CPU's own /proc/cpuinfo


def this_host() -> Host:
    return read_host(Path("/"))


def cpuinfo_field(name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """One field of the first processor in /proc/cpuinfo, read here apart from the
    product's own reader."""
    first = cpuinfo.read_text().split("\n\n")[0]
    line = next(ln for ln in first.splitlines() if ln.split(":")[0].strip() == name)
    return line.split(":", 1)[1].strip()


def cpuinfo_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    return set(cpuinfo_field("flags", cpuinfo).split())


def serving_dtype() -> str:
    """What vLLM should serve in here: bf16 where the CPU computes it, float32 elsewhere."""
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & cpuinfo_flags() else "float32"


def has_amx() -> bool:
    """What the kernel should offer here: AMX in the CPU's flags on Linux 5.16 or newer.
    Under the AVX2 view (tests/support/avx2_machine.py) /proc/cpuinfo is a Zen 3's but
    the kernel still grants the CPU's AMX: the flags come from the real cpuinfo the view
    kept."""
    release = tuple(int(n) for n in os.uname().release.split("-")[0].split(".")[:2])
    real = Path(os.environ.get("ZENVLLM_TEST_AVX2_VIEW", "/nonexistent")) / REAL_CPUINFO
    flags = cpuinfo_flags(real) if real.is_file() else this_host().flags
    return "amx_tile" in flags and release >= (5, 16)


def zentorch_active() -> bool:
    """vLLM's ZenCpuPlatform and zentorch's bf16 path: AuthenticAMD with AVX-512 BF16."""
    host = this_host()
    return host.vendor == "AuthenticAMD" and {"avx512f", "avx512_bf16"} <= host.flags


# Faked /proc/cpuinfo views (bind-mounted into a container) for the CPU kinds users
# have, from the fixture hosts' first processor: the launcher and vLLM read vendor and
# flags there, while the kernel and the real ISA stay this machine's.
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
KINDS = {
    "amd-zen3-avx2": "vm-milan-8vcpu-avx2",
    "amd-zen4": "test-machine-zen4-2cpu",
    "intel-amx": "xeon-8480-spr-amx",
}


def fake_cpuinfo(kind: str, cpus: int) -> str:
    """`cpus` processors (this machine's count, as sysfs shows them) of the given kind."""
    first = (FIXTURES / KINDS[kind] / "proc" / "cpuinfo").read_text().split("\n\n")[0]
    return "".join(
        re.sub(r"^processor\t: \d+$", f"processor\t: {i}", first, flags=re.M) + "\n\n"
        for i in range(cpus)
    )


def fake_host(kind: str) -> Host:
    """The fixture host of a kind: its vendor and flags are what the fake view shows."""
    return read_host(FIXTURES / KINDS[kind])
