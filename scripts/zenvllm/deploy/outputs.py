"""Directories zenvllm writes whole (`render --output`, `bench --out`, build contexts,
the bench gateway's work directory): never one it did not make.

An output path is accepted only when nothing is there yet, or when it is a directory
whose marker file records what zenvllm wrote there (every entry's name and SHA-256)
and which holds exactly that. Ownership is proven by content, never by names: a
foreign, empty or changed directory, a marker that records nothing (an older
zenvllm's), a file or a symlink is refused before any work starts, naming the path,
what is there and the fix. Owned directories are replaced atomically: the new content
is written beside them, sealed, and swapped in with two renames. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zenvllm.core import gate
from zenvllm.core.errors import UserError

MARKER = ".zenvllm-output"
HEADER = "# zenvllm output 2: zenvllm may replace this directory while it holds exactly:\n"


def entries(path: Path) -> dict[str, str]:
    """Every entry under `path` but the marker: relative name -> SHA-256 for a regular
    file, "dir" for a directory, what it is for anything else (which zenvllm never
    writes, so it never matches a manifest). Symlinks are not followed."""
    found: dict[str, str] = {}
    for top, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            full = Path(top) / name
            rel = str(full.relative_to(path))
            mode = full.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[rel] = f"symlink to {os.readlink(full)}"
            elif stat.S_ISDIR(mode):
                found[rel] = "dir"
            elif stat.S_ISREG(mode):
                found[rel] = gate.digest(full)
            else:
                found[rel] = gate.describe(mode)
    found.pop(MARKER, None)
    return found


def seal(path: Path) -> None:
    """Record what `path` holds now in its marker: zenvllm's proof it wrote it."""
    lines = [f"{kind}  {name}\n" for name, kind in sorted(entries(path).items())]
    (path / MARKER).write_text(HEADER + "".join(lines))


def recorded(marker: Path) -> dict[str, str] | None:
    """The entries a marker records; None when it is not a zenvllm manifest."""
    try:
        text = gate.read_text(marker, gate.DOCUMENT, "")
    except (gate.InputError, OSError):
        return None
    if not text or not text.startswith(HEADER):
        return None
    kinds = {}
    for line in text[len(HEADER) :].splitlines():
        kind, sep, name = line.partition("  ")
        if not sep:
            return None
        kinds[name] = kind
    return kinds


def changes(wrote: dict[str, str], holds: dict[str, str]) -> str:
    """What differs, briefly: "added x; changed y; removed z"."""
    parts = []
    for label, names in (
        ("added", sorted(set(holds) - set(wrote))),
        ("changed", sorted(n for n in set(holds) & set(wrote) if holds[n] != wrote[n])),
        ("removed", sorted(set(wrote) - set(holds))),
    ):
        if names:
            parts.append(f"{label} {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}")
    return "; ".join(parts)


def _what_is_there(path: Path) -> str | None:
    """Why zenvllm may not replace `path`; None when it may."""
    if path.is_symlink():
        return f"a symbolic link (to {os.readlink(path)})"
    if not path.exists():
        return None
    if not path.is_dir():
        return "a file" if path.is_file() else gate.describe(path.stat().st_mode)
    marker = path / MARKER
    if marker.is_file() and not marker.is_symlink():
        wrote = recorded(marker)
        if wrote is None:
            return (
                f"a directory whose {MARKER} does not record what zenvllm wrote (an older "
                "zenvllm's, or not zenvllm's)"
            )
        diff = changes(wrote, entries(path))
        return f"a directory zenvllm made, changed since ({diff})" if diff else None
    names = {p.name for p in path.iterdir()}
    if not names:
        return "an empty directory zenvllm did not make"
    shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    return f"a directory zenvllm did not make, holding {len(names)} entries ({shown})"


def check_output(path: Path, option: str) -> Path:
    """The absolute output path, or a UserError before anything is written."""
    problem = _what_is_there(Path(path))
    if problem:
        raise UserError(
            f"{option} {path} is {problem}; zenvllm replaces only directories it made "
            f"and nobody changed (their {MARKER} records each file's SHA-256). Give a path "
            "that does not exist yet, or remove that one first"
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
    # A uuid4's 122 random bits: a directory of this name is this call's. It is made
    # inside the try, so an interrupt right after the mkdir still removes it (with
    # mkdtemp before the try, a Ctrl-C in between left it behind).
    staging = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex}"
    try:
        staging.mkdir()
        staging.chmod(0o755)  # outputs get normal permissions, whatever the umask
        yield staging
        seal(staging)
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
    """A directory zenvllm made that holds exactly what its marker records."""
    return Path(path).is_dir() and _what_is_there(Path(path)) is None


def claim(path: Path, option: str) -> Path:
    """A working directory zenvllm owns from now on (refused as check_output refuses);
    `seal` it after writing, or `remove_owned` will leave it."""
    out = check_output(path, option)
    out.mkdir(parents=True, exist_ok=True)
    seal(out)
    return out


def remove_owned(path: Path) -> None:
    """Remove `path` only if zenvllm made it and it holds what zenvllm wrote."""
    if owned(path):
        shutil.rmtree(path, ignore_errors=True)
