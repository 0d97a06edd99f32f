"""Whether a container's start is warm: vLLM and Inductor pointed at the compile cache
(core/compile_cache.py), the artifacts already in it counted, and whether it outlives
the container (a mount). The launcher logs its line; the bench counts the same way.
Standard library only."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from zenvllm.core import compile_cache, gate

MOUNTINFO = Path("/proc/self/mountinfo")
MAX_COUNTED = 100_000  # a walk of the cache stops here: enough to say "warm"


def mount_points(mountinfo: str) -> set[str]:
    """The mount points of /proc/self/mountinfo (its fifth field; spaces as \\040)."""
    points = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.add(fields[4].replace("\\040", " "))
    return points


def artifacts(root: Path) -> tuple[int, int]:
    """Files and bytes Inductor left under the cache (its kernels, graphs), bounded."""
    files = size = 0
    for path in (root / "inductor").rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                files, size = files + 1, size + path.stat().st_size
        if files >= MAX_COUNTED:
            break
    return files, size


def use_compile_cache(env: dict[str, str]) -> str:
    """Point vLLM and Inductor at the cache directory (where the environment does not
    already) and say whether this start is warm; vLLM's defaults where it is not writable."""
    root = env.get("VLLM_CACHE_ROOT") or compile_cache.CONTAINER_DIR
    if not os.access(root, os.W_OK):
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        return compile_cache.describe(root, 0, 0, kept=False)
    for key, value in compile_cache.env(root).items():
        env.setdefault(key, value)
    mounts = gate.read_text(MOUNTINFO, gate.PROCFS, "run it on Linux", optional=True) or ""
    kept = root.rstrip("/") in mount_points(mounts)
    return compile_cache.describe(root, *artifacts(Path(root)), kept=kept)
