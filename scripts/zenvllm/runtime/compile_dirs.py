"""The compile cache's directories on the host (core/compile_cache.py: ROOT/INSTANCE/KEY),
made before a rollout in one process:

    python3 -m zenvllm.runtime compile-cache prepare --root ROOT --owner U:G [DIR ...] [--dry-run]

The instances role ran a module per step (a stat and a find for the mark, the root, the
mark file, each instance's directory: 5 module runs and one per instance, 0.2 s of CPU
and a connection apiece, on every run). ROOT is zenvllm's by its mark file (by content):
nothing is written into a ROOT that exists without it, and nothing outside ROOT.
Standard library only.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from zenvllm.core import compile_cache, gate
from zenvllm.core.errors import UserError
from zenvllm.runtime.atomic import write_atomically

FIX = "give zenvllm_instances_compile_cache_dir a directory zenvllm made, or ''"
# ROOT and its mark are the user's who runs this (root, as the role does); only the
# container's user writes a key's directory.
ROOT_MODE, MARK_MODE, KEY_MODE = 0o755, 0o644, 0o700
ME = (os.geteuid(), os.getegid())
# The whole mark file, as the role wrote it before this step was one process.
MARK_TEXT = (
    f"{compile_cache.MARK} vLLM compile caches of zenvllm's instances; "
    "removed by zenvllm_state=absent\n"
)


def marked(root: Path) -> bool:
    """Whether ROOT is zenvllm's: its mark file starts with the mark (by content)."""
    text = gate.read_text(root / compile_cache.MARK_FILE, gate.SMALL, FIX, optional=True)
    return text is not None and text.startswith(compile_cache.MARK)


def foreign(root: Path) -> str | None:
    """The refusal when something at ROOT is not zenvllm's, else None (nothing there yet
    is zenvllm's to make)."""
    try:
        ours = not os.path.lexists(root) or (root.is_dir() and marked(root))
    except (gate.InputError, OSError):
        ours = False
    if ours:
        return None
    return (
        f"{root} exists and zenvllm did not make it (no {compile_cache.MARK_FILE} with "
        "zenvllm's mark in it); zenvllm never writes into a directory it does not manage. "
        'Move it away, or give zenvllm_instances_compile_cache_dir another path ("" keeps '
        "no compile cache)."
    )


def ids(owner: str) -> tuple[int, int]:
    """USER:GROUP (names or numbers, as Ansible's file module takes them) as uid and gid."""
    user, _, group = owner.partition(":")
    group = group or user
    try:
        uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise UserError(
            f"--owner {owner}: no such user or group on this host; give "
            "zenvllm_instances_user as UID:GID (the image's vLLM user is 10001:10001)"
        ) from None
    return uid, gid


def inside(root: Path, path: Path) -> Path:
    """path, refused unless it lies below ROOT as written and once links are followed."""
    real, top = gate.resolved(path, str(path), FIX), gate.resolved(root, str(root), FIX)
    if not path.is_relative_to(root) or real == top or top not in real.parents:
        raise UserError(f"{path} is not inside the compile cache directory {root}; {FIX}")
    return real


def directory(path: Path) -> os.stat_result:
    """path's own status, refused unless it is a directory (a link is not followed)."""
    st = path.lstat()
    if stat.S_ISDIR(st.st_mode):
        return st
    kind = (
        "a symbolic link"
        if stat.S_ISLNK(st.st_mode)
        else "a file"
        if stat.S_ISREG(st.st_mode)
        else gate.describe(st.st_mode)
    )
    raise UserError(f"{path} is {kind}, not a directory; move it away, or {FIX}")


def settled(path: Path, mode: int, uid: int, gid: int, dry_run: bool) -> bool:
    """path of that mode and owner, made a directory if missing (as Ansible's file
    module makes one): whether anything was, or would be, done."""
    if not os.path.lexists(path):
        if not dry_run:
            path.mkdir(mode=mode)
            os.chown(path, uid, gid)
            path.chmod(mode)
        return True
    st = directory(path)
    if (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (mode, uid, gid):
        return False
    if not dry_run:
        os.chown(path, uid, gid)
        path.chmod(mode)
    return True


def mark_whole(mark: Path) -> bool:
    """The mark file says what it should, this user's and 0644 (as `copy` left it)."""
    if gate.read_text(mark, gate.SMALL, FIX, optional=True) != MARK_TEXT:
        return False
    st = mark.stat()
    return (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (MARK_MODE, *ME)


def prepare(root: Path, dirs: list[Path], owner: str, dry_run: bool) -> list[str]:
    """ROOT (this user's) with its mark, and each key's directory (the container's user's, as
    is an instance directory made for it above the key): what was made or set right, or
    would be, in order."""
    refused = foreign(root)
    if refused:
        raise UserError(refused)
    uid, gid = ids(owner)
    for path in dirs:  # every one refused before anything is made
        inside(root, path)
    parts = [path.relative_to(root).parts for path in dirs]
    if not dry_run:  # its parents too, where missing (/var/cache on a fresh host), as root's
        os.makedirs(root.parent, mode=ROOT_MODE, exist_ok=True)
    done = [str(root)] if settled(root, ROOT_MODE, *ME, dry_run) else []
    mark = root / compile_cache.MARK_FILE
    if not mark_whole(mark):
        if not dry_run:
            write_atomically(mark, MARK_TEXT)  # root's, 0644
        done.append(str(mark))
    for rel in parts:
        # Above the key, what is missing is made as the key is (Ansible's file module
        # did so) and what exists stays as it is; the key's directory is set right.
        for i in range(1, len(rel) + 1):
            level = root.joinpath(*rel[:i])
            if i < len(rel) and os.path.lexists(level):
                directory(level)
            elif settled(level, KEY_MODE, uid, gid, dry_run) and str(level) not in done:
                done.append(str(level))
    return done
