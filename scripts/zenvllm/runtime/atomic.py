"""Replace a file in one rename: a reader, a crash or a Ctrl-C sees the old file or the
new one, never half of it (calibration files, a model directory's record, the planner
zipapp)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    """Text is written as UTF-8, bytes as they are; the file gets `mode` before it is
    in place (a secret's 0600 is never wider, even for a moment)."""
    data = content.encode() if isinstance(content, str) else content
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
