"""AMX tile permission: ask Linux for it before vLLM's AMX kernels run.

Linux (5.16+) gives a process AMX tile state only after it asks with
`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`. vLLM 0.32 picks its AMX
attention kernel for bf16 on CPUs with AMX but never asks, so the worker dies
with "Illegal instruction" at the first request, unless a oneDNN AMX op happened
to ask first. The images run `request()` in every Python process at start (a
`.pth` line in the venv, spawned workers included); the launcher and doctor
report `state()`.

Whether to ask comes from the kernel (ARCH_GET_XCOMP_SUPP), not /proc/cpuinfo:
the kernel knows what the CPU and its own XSAVE setup support, and a container
may show a different cpuinfo. Standard library only; never raises.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import dataclass

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_GET_XCOMP_SUPP = 0x1021
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


@dataclass(frozen=True)
class AmxState:
    supported: bool  # the CPU has AMX and the kernel offers its tile state
    granted: bool  # this process may use AMX tiles
    error: str = ""  # why the kernel could not say, or refused


# The image's site-packages/zenvllm_amx.pth: .pth files run their `import` lines at
# every interpreter start (sorted after zenvllm.pth, which puts the package on the path).
PTH_LINE = "import zenvllm.runtime.amx as amx; amx.request_at_start()\n"

# Set by `request_at_start()` (the image's .pth line): the launcher tells the
# hook's own result apart from a request it had to make itself.
AT_START: AmxState | None = None


def _arch_prctl(code: int, arg: object) -> tuple[int, int]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(SYS_ARCH_PRCTL, code, arg)
    return rc, ctypes.get_errno() if rc else 0


def _mask(code: int) -> tuple[int | None, str]:
    value = ctypes.c_uint64(0)
    rc, err = _arch_prctl(code, ctypes.byref(value))
    return (value.value, "") if rc == 0 else (None, os.strerror(err))


def _tiledata(mask: int | None) -> bool:
    return mask is not None and bool(mask >> XFEATURE_XTILEDATA & 1)


def state() -> AmxState:
    """What the kernel says now, without asking for anything."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return AmxState(False, False, "not x86_64 Linux")
    supported, err = _mask(ARCH_GET_XCOMP_SUPP)
    if supported is None:  # kernels before 5.16 know no AMX
        return AmxState(False, False, f"arch_prctl(ARCH_GET_XCOMP_SUPP): {err}")
    permitted, err = _mask(ARCH_GET_XCOMP_PERM)
    return AmxState(_tiledata(supported), _tiledata(permitted), err)


def request() -> AmxState:
    """Ask for AMX tile data where the kernel offers it; the state afterwards."""
    before = state()
    if not before.supported or before.granted:
        return before
    rc, err = _arch_prctl(ARCH_REQ_XCOMP_PERM, ctypes.c_ulong(XFEATURE_XTILEDATA))
    after = state()
    if rc:
        return AmxState(after.supported, after.granted, f"ARCH_REQ_XCOMP_PERM: {os.strerror(err)}")
    return after


def request_at_start() -> None:
    """The image's .pth hook: must never stop an interpreter from starting."""
    global AT_START
    try:
        AT_START = request()
    except Exception as err:  # a broken hook must not stop every interpreter
        AT_START = AmxState(False, False, f"{type(err).__name__}: {err}")


def describe(amx: AmxState, cpuinfo_has_amx: bool, at_start: bool) -> str:
    """One line for the launcher and doctor: what holds and what follows."""
    if not amx.supported:
        if cpuinfo_has_amx:
            return (
                "AMX: /proc/cpuinfo lists amx_tile but the kernel offers no tile state "
                f"({amx.error or 'XTILEDATA not supported'}); vLLM will not use AMX"
            )
        return "AMX: not on this CPU; nothing to request"
    who = "at interpreter start (zenvllm.pth)" if at_start else "by this process"
    if amx.granted:
        return f"AMX: tile permission requested {who} and granted; vLLM may use AMX kernels"
    return (
        f"AMX: tile permission refused ({amx.error or 'not granted'}); vLLM's AMX kernels "
        "would die with 'Illegal instruction'. Fix: allow arch_prctl in the container's "
        "seccomp profile (Docker's default and zenvllm's allow it)"
    )


# describe()'s line, read back from an instance's log by `zenvllm status`.
VERDICTS = (
    ("and granted", "granted"),
    ("permission refused", "refused"),
    ("not on this CPU", "none"),
    ("offers no tile state", "no kernel support"),
)


def verdict(log: str) -> str:
    """The launcher's AMX line in a log, as one word ("" when there is none)."""
    found = re.search(r"zenvllm-launch: AMX: (.*)", log)
    return next((word for text, word in VERDICTS if found and text in found[1]), "")
