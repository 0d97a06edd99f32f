"""`zenvllm doctor`: what this host has and lacks for each image target.

`diagnose(host, probes)` is pure: one Check per line, each saying what was
found and what follows from it. `probes.probe(root)` gathers the few facts that
need the live machine. Standard library only.
"""

from __future__ import annotations

import errno
import os
from dataclasses import asdict, dataclass

from zenvllm.core.host import GIB, Host
from zenvllm.core.targets import TARGETS, missing_isa
from zenvllm.core.topology import format_cpu_list
from zenvllm.runtime.amx import AmxState
from zenvllm.runtime.probes import Probes

OK, WARN, FAIL, NA, INFO, NOT_CHECKED = "ok", "warn", "fail", "n/a", "info", "not checked"
SECCOMP_FIX = (
    "run the container with --cap-add SYS_NICE --security-opt seccomp=<zenvllm seccomp "
    "profile> (Docker's default profile allows the NUMA syscalls only with SYS_NICE)"
)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail | n/a | info | not checked
    finding: str
    consequence: str = ""


# ------------------------------------------------------------------ pure checks


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def check_cpu(host: Host) -> Check:
    isa = sorted(host.isa)
    absent = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni") if f not in host.flags]
    finding = f"{host.vendor or 'unknown vendor'} {host.model_name!r}; ISA: {' '.join(isa) or '-'}"
    if "avx2" not in host.flags:
        return Check("isa", FAIL, finding, "no AVX2: no zenvllm image runs on this CPU")
    if "avx512f" not in host.flags:
        return Check(
            "isa",
            WARN,
            finding + "; AVX-512 absent",
            "AVX2 kernels only; zen and pace will not accelerate here",
        )
    note = f"; absent: {' '.join(absent)}" if absent else ""
    return Check("isa", OK, finding + note, "AVX-512 kernels available")


def check_vllm_openai(host: Host) -> Check:
    if missing_isa(TARGETS["vllm-openai"], host):
        return Check("vllm-openai", FAIL, "needs avx2, absent", "vLLM's CPU build cannot run")
    fast = [f for f in ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16") if f in host.flags]
    if "avx512f" in host.flags:
        amx_note = ", and AMX kernels for bf16 (see amx)" if "amx_tile" in host.flags else ""
        return Check(
            "vllm-openai",
            OK,
            f"avx2 + {' '.join(fast)}",
            f"runs; vLLM picks its AVX-512 kernels at run time{amx_note}",
        )
    return Check(
        "vllm-openai", OK, "avx2, no AVX-512", "runs on AVX2 kernels (slower than AVX-512 hosts)"
    )


def check_zen(host: Host) -> Check:
    """The CPU side only; whether zentorch is installed here is its own line."""
    if host.vendor and host.vendor != "AuthenticAMD":
        return Check(
            "zen",
            NA,
            f"not an AMD CPU ({host.vendor})",
            "zentorch and vLLM's AMD Zen platform are AMD-only: the zen image serves as "
            "vllm-openai would, and its launcher logs why zentorch is inactive; use vllm-openai",
        )
    missing = missing_isa(TARGETS["zen"], host)
    if missing:
        return Check(
            "zen",
            WARN,
            f"lacks {' '.join(missing)}",
            "the zen image serves but zentorch stays inactive: vLLM selects its AMD Zen platform "
            "only with AuthenticAMD + avx512 in cpuinfo, and zentorch's bf16 path needs "
            "avx512_bf16; use vllm-openai",
        )
    return Check(
        "zen",
        OK,
        "AuthenticAMD + avx512f + avx512_bf16",
        "the zen image's zentorch bf16 kernels and vLLM's AMD Zen platform apply",
    )


def check_pace(host: Host) -> Check:
    """pace-vllm's own rule: avx512f and avx512_bf16 in cpuinfo, whatever the vendor."""
    missing = missing_isa(TARGETS["pace"], host)
    if missing:
        return Check(
            "pace",
            WARN,
            f"lacks {' '.join(missing)}",
            "the pace image serves but pace-vllm will not accelerate here",
        )
    tuned = "" if host.vendor in ("AuthenticAMD", "") else " (pace-vllm is published for AMD EPYC)"
    return Check("pace", OK, "avx512f + avx512_bf16", f"pace-vllm can accelerate{tuned}")


AMX_FLAGS = ("amx_tile", "amx_bf16", "amx_int8")


def check_amx(host: Host, amx: AmxState | None) -> Check:
    """AMX needs a per-process permission from Linux; vLLM 0.32 never asks for it."""
    listed = [f for f in AMX_FLAGS if f in host.flags]
    if amx is None:
        if not listed:
            return Check("amx", NA, "no AMX in cpuinfo", "vLLM uses its AVX-512 or AVX2 kernels")
        return Check(
            "amx",
            NOT_CHECKED,
            f"{' '.join(listed)} in cpuinfo; the kernel's tile permission needs the live machine",
        )
    if amx.supported and amx.granted:
        return Check(
            "amx",
            OK,
            f"{' '.join(listed) or 'AMX'}; the kernel grants tile permission (arch_prctl)",
            "vLLM's AMX kernels run: every Python process of the images asks at start",
        )
    if amx.supported:
        return Check(
            "amx",
            FAIL,
            f"{' '.join(listed) or 'AMX'}; the kernel refused tile permission ({amx.error})",
            "vLLM's bf16 AMX kernels would die with 'Illegal instruction'; fix: allow "
            "arch_prctl in the seccomp profile (Docker's default and zenvllm's allow it)",
        )
    if listed:
        return Check(
            "amx",
            WARN,
            f"{' '.join(listed)} in cpuinfo, but the kernel offers no tile state ({amx.error})",
            "vLLM runs without AMX; fix: Linux 5.16 or newer (AMX tile state support)",
        )
    return Check("amx", NA, "no AMX on this CPU", "vLLM uses its AVX-512 or AVX2 kernels")


def check_numa(host: Host, probes: Probes) -> Check:
    with_cpus = [n.id for n in host.nodes if n.cpus]
    memory_only = [n.id for n in host.nodes if not n.cpus]
    if not probes.numa_sysfs:
        return Check(
            "numa",
            WARN,
            "no sys/devices/system/node (kernel without NUMA sysfs, or hidden)",
            "planned as one node holding every CPU and all memory",
        )
    finding = f"{len(host.nodes)} node(s); with CPUs: {format_cpu_list(with_cpus)}"
    if memory_only:
        finding += f"; memory-only: {format_cpu_list(memory_only)}"
    consequence = (
        "each instance stays inside one node (CPUs and memory)"
        if len(with_cpus) > 1
        else "one node: instances split its cores"
    )
    if memory_only:
        consequence += "; memory-only nodes run no instance"
    return Check("numa", OK if len(with_cpus) else WARN, finding, consequence)


def check_mempolicy(probes: Probes) -> Check:
    err = probes.mempolicy_errno
    if err is None:
        return Check("mempolicy", NOT_CHECKED, "needs the live kernel (not a fixture root)")
    if err == 0:
        return Check(
            "mempolicy", OK, "get_mempolicy permitted", "NUMA memory binding (mbind) works"
        )
    if err == errno.EPERM:
        return Check(
            "mempolicy",
            FAIL,
            "get_mempolicy: Operation not permitted (a container without SYS_NICE or a "
            "seccomp profile that blocks the NUMA syscalls)",
            f"vLLM cannot bind memory to a node; fix: {SECCOMP_FIX}",
        )
    if err == errno.ENOSYS:
        return Check(
            "mempolicy",
            WARN,
            "get_mempolicy: not implemented (kernel without NUMA)",
            "memory binding is skipped; fine on a single node",
        )
    return Check(
        "mempolicy", WARN, f"get_mempolicy failed: {os.strerror(err)}", "memory binding may fail"
    )


def _lib_check(name: str, found: str | None, what: str) -> Check:
    if found is None:
        return Check(name, NOT_CHECKED, "needs the live filesystem (not a fixture root)")
    if found:
        return Check(name, OK, found, f"can be LD_PRELOADed ({what})")
    return Check(
        name,
        WARN,
        "not found on this host",
        f"the zenvllm images bring their own; install it only to run vLLM outside them ({what})",
    )


def check_zentorch(host: Host, zentorch: str | None) -> Check:
    if zentorch is None:
        return Check("zentorch", NOT_CHECKED, "needs the live Python environment")
    if not zentorch:
        return Check(
            "zentorch", INFO, "not installed in this Python", "the zen image carries zentorch"
        )
    missing = missing_isa(TARGETS["zen"], host)
    if missing:
        return Check(
            "zentorch",
            WARN,
            f"zentorch {zentorch} installed",
            f"importable but inactive on this CPU (lacks {' '.join(missing)})",
        )
    return Check("zentorch", OK, f"zentorch {zentorch} installed", "usable on this CPU")


def check_vllm(version: str | None) -> Check:
    if version is None:
        return Check("vllm", NOT_CHECKED, "needs the live Python environment")
    if not version:
        return Check("vllm", INFO, "not installed in this Python", "the images carry vLLM")
    return Check("vllm", OK, f"vLLM {version} installed", "can serve outside the images too")


def check_cgroup(host: Host, version: int | None) -> Check:
    online = len(host.cpus)
    limits = []
    if len(host.allowed_cpus) < online:
        limits.append(
            f"cpuset {format_cpu_list(host.allowed_cpus)} ({len(host.allowed_cpus)} of {online} "
            "CPUs)"
        )
    if len(host.allowed_mems) < len(host.nodes):
        limits.append(f"mems {format_cpu_list(host.allowed_mems)}")
    if host.cgroup_mem_limit_bytes is not None:
        limits.append(f"memory limit {_gib(host.cgroup_mem_limit_bytes)}")
    label = f"cgroup v{version}" if version else "no cgroup fs"
    if not limits:
        return Check("cgroup", OK, f"{label}: no CPU or memory limits", "the whole host is usable")
    return Check(
        "cgroup",
        INFO,
        f"{label}: {', '.join(limits)}",
        "the planner uses only the allowed CPUs and nodes and fits within the memory limit",
    )


def check_smt(host: Host) -> Check:
    cores = len({c.core for c in host.cpus})
    if host.smt:
        return Check(
            "smt",
            INFO,
            f"on: {len(host.cpus)} CPUs on {cores} cores",
            "one OpenMP thread per physical core; the siblings serve the API server",
        )
    return Check(
        "smt",
        INFO,
        f"off or not exposed: {cores} cores",
        "an instance of 8 cores or more keeps one for its API server; smaller ones give "
        "OpenMP every core",
    )


def check_memory(host: Host, node_mem_sysfs: tuple[int, ...] = ()) -> Check:
    nodes = ", ".join(f"node {n.id} {_gib(n.mem_total_bytes)}" for n in host.nodes)
    finding = (
        f"{_gib(host.mem_total_bytes)} total, {_gib(host.mem_available_bytes)} available ({nodes})"
    )
    stated = sum(node_mem_sysfs)
    if stated and stated < 0.9 * host.mem_total_bytes:
        # Seen on Firecracker VMs: node0 meminfo counts a fraction of the RAM.
        finding += f"; node sysfs states only {_gib(stated)}, /proc/meminfo's total is used"
    return Check("memory", INFO, finding, "weights, KV cache and shm are sized from these")


def diagnose(host: Host, probes: Probes) -> list[Check]:
    return [
        check_cpu(host),
        check_vllm_openai(host),
        check_zen(host),
        check_pace(host),
        check_amx(host, probes.amx),
        check_numa(host, probes),
        check_mempolicy(probes),
        _lib_check("tcmalloc", probes.tcmalloc, "faster allocation for vLLM's CPU backend"),
        _lib_check(
            "iomp", probes.iomp, "Intel OpenMP, which vLLM's CPU backend binds threads with"
        ),
        check_zentorch(host, probes.zentorch),
        check_vllm(probes.vllm),
        check_cgroup(host, probes.cgroup_version),
        check_smt(host),
        check_memory(host, probes.node_mem_sysfs),
    ]


def render(host: Host, checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"zenvllm doctor: {host.source}"]
    for c in checks:
        tail = f" -> {c.consequence}" if c.consequence else ""
        lines.append(f"{c.status:<11} {c.name:<{width}}  {c.finding}{tail}")
    return "\n".join(lines)


def to_dict(host: Host, checks: list[Check]) -> dict[str, object]:
    return {
        "source": host.source,
        "vendor": host.vendor,
        "model_name": host.model_name,
        "checks": [asdict(c) for c in checks],
        "targets": {c.name: c.status for c in checks if c.name in TARGETS},
    }
