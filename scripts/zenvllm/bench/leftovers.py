"""What OpenMP and vLLM leave behind after a server stops: libiomp5's registration
files in /dev/shm (`__KMP_REGISTERED_LIB_<pid>_<n>`) and vLLM's `/tmp/vllm_dist_*`
directories. The bench removes those that appeared during its run, nothing else.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SHM_LEFTOVERS = Path("/dev/shm")
TMP_LEFTOVERS = Path("/tmp")


def found() -> set[Path]:
    return set(SHM_LEFTOVERS.glob("__KMP_REGISTERED_LIB_*")) | set(
        TMP_LEFTOVERS.glob("vllm_dist_*")
    )


def pid_alive(path: Path) -> bool:
    """__KMP_REGISTERED_LIB_<pid>_<n>: alive while that process runs."""
    parts = path.name.split("_")
    try:
        return Path(f"/proc/{int(parts[-2])}").exists()
    except (ValueError, IndexError):
        return False


def clean(before: set[Path]) -> list[Path]:
    """Remove OpenMP registration files and vLLM dist dirs that appeared during the run
    (never anything that was there before, or whose OpenMP owner still runs)."""
    removed = []
    for path in found() - before:
        if path.name.startswith("__KMP") and pid_alive(path):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed
