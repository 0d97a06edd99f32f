"""Directories zenvllm writes whole (`render --output`, `bench --out`, build contexts):
never one it did not make.

An output path is accepted only when nothing is there yet, or when it is a
directory zenvllm made before, recognised by the marker file it writes into
every such directory. Anything else (a file, a foreign or empty directory, a
symlink) is refused before any work starts, naming the path, what is there and
the fix. Owned directories are replaced atomically: the new content is written
beside them and swapped in with two renames. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zenvllm.core.errors import UserError

MARKER = ".zenvllm-output"
MARK_TEXT = "written by zenvllm; it may replace this directory\n"
# Build contexts written before the marker existed hold exactly these names.
LEGACY_CONTEXT = {
    "Dockerfile",
    "image.json",
    "constraints.txt",
    "overrides.txt",
    "zenvllm",
    "wheelhouse",
    "certs",
    "zenvllm_amx.pth",
}


def _what_is_there(path: Path) -> str | None:
    """Why zenvllm may not replace `path`; None when it may."""
    if path.is_symlink():
        return f"a symbolic link (to {os.readlink(path)})"
    if not path.exists():
        return None
    if not path.is_dir():
        return "a file" if path.is_file() else "not a directory"
    if (path / MARKER).is_file():
        return None
    names = {p.name for p in path.iterdir()}
    if not names:
        return "an empty directory zenvllm did not make"
    if "Dockerfile" in names and names <= LEGACY_CONTEXT:
        head = (path / "Dockerfile").read_text(errors="replace")[:400]
        if "Rendered by `zenvllm render`" in head:
            return None  # a context an earlier zenvllm rendered
    shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    return f"a directory zenvllm did not make, holding {len(names)} entries ({shown})"


def check_output(path: Path, option: str) -> Path:
    """The absolute output path, or a UserError before anything is written."""
    problem = _what_is_there(Path(path))
    if problem:
        raise UserError(
            f"{option} {path} is {problem}; zenvllm replaces only directories it made "
            f"(they hold a {MARKER} file). Give a path that does not exist yet, "
            "or remove that one first"
        )
    return Path(os.path.abspath(path))


@contextmanager
def staged(path: Path, option: str) -> Iterator[Path]:
    """Write into a staging directory beside `path`; on success it replaces `path`.

    On any error, Ctrl-C or SIGTERM (the CLI raises it as KeyboardInterrupt), the staging
    directory goes and `path` stays as it was.
    """
    out = check_output(path, option)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        staging.chmod(0o755)  # mkdtemp makes 0700; outputs get normal permissions
        (staging / MARKER).write_text(MARK_TEXT)
        yield staging
        swap(staging, out, option)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def swap(staging: Path, out: Path, option: str) -> None:
    check_output(out, option)  # again: something may have appeared meanwhile
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        out.rename(old)
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def owned(path: Path) -> bool:
    """A directory zenvllm made: its marker inside, and not reached through a symlink."""
    return not Path(path).is_symlink() and (Path(path) / MARKER).is_file()


def claim(path: Path, option: str) -> Path:
    """A working directory zenvllm owns from now on (refused as check_output refuses)."""
    out = check_output(path, option)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(MARK_TEXT)
    return out


def remove_owned(path: Path) -> None:
    """Remove `path` only if zenvllm made it; anything else stays."""
    if owned(path):
        shutil.rmtree(path, ignore_errors=True)
