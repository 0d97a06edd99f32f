"""Real Python interpreters of other versions on this machine, to run the host layers
on the oldest Python README names: pyenv's build, else the PATH's `pythonX.Y`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

PYENV = Path.home() / ".pyenv" / "versions"


def find(version: str) -> Path | None:
    """An interpreter of `version` ("3.10") that runs, or None when the machine has none
    (pyenv's shims are on PATH too, and answer for versions that are not selected)."""
    built = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    on_path = shutil.which(f"python{version}")
    for candidate in [*reversed(built), *([Path(on_path)] if on_path else [])]:
        done = subprocess.run([str(candidate), "-c", ""], capture_output=True, check=False)
        if done.returncode == 0:
            return candidate
    return None
