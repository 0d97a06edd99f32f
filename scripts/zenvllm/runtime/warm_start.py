"""Whether a container's start is warm: vLLM and Inductor pointed at the compile cache
(core/compile_cache.py), the artifacts already in it counted, and whether it outlives
the container (a mount). The launcher logs its line; the bench counts the same way.
Standard library only."""

from __future__ import annotations

import contextlib
import os
import re
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


def inductor_default_dir(env: dict[str, str], uid: int) -> Path:
    """Where torch's default_cache_dir() points for this environment and user: the
    temporary directory's torchinductor_USER (USER as getpass finds it)."""
    user = next((env[k] for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if env.get(k)), "")
    if not user:
        try:
            import pwd  # POSIX only; the launcher runs in a Linux container

            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = f"uid_{uid}"
    tmp = next((env[k] for k in ("TMPDIR", "TEMP", "TMP") if env.get(k)), "/tmp")
    return Path(tmp) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def keep_inductor_headers(env: dict[str, str], uid: int) -> None:
    """Inductor builds its precompiled headers under its default cache directory,
    whatever TORCHINDUCTOR_CACHE_DIR says (torch 2.13's codecache._HEADER_DIR), and that
    directory dies with the container: a warm start ran g++ on them again. Where it does
    not exist yet, it becomes a link into the kept cache."""
    default = inductor_default_dir(env, uid)
    if default.exists() or default.is_symlink():
        return
    with contextlib.suppress(OSError):  # a start without the link only builds them again
        Path(env["TORCHINDUCTOR_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)
        default.symlink_to(env["TORCHINDUCTOR_CACHE_DIR"], target_is_directory=True)


def use_compile_cache(env: dict[str, str]) -> str:
    """Point vLLM and Inductor at the cache directory (where the environment does not
    already) and say whether this start is warm; vLLM's defaults where it is not writable."""
    root = env.get("VLLM_CACHE_ROOT") or compile_cache.CONTAINER_DIR
    if not os.access(root, os.W_OK):
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        return compile_cache.describe(root, 0, 0, kept=False)
    for key, value in compile_cache.env(root).items():
        env.setdefault(key, value)
    keep_inductor_headers(env, os.getuid())
    mounts = gate.read_text(MOUNTINFO, gate.PROCFS, "run it on Linux", optional=True) or ""
    kept = root.rstrip("/") in mount_points(mounts)
    return compile_cache.describe(root, *artifacts(Path(root)), kept=kept)
