"""An instance's empty compile cache started from a sibling's, so a rolling update
compiles once, not once per instance (core/compile_cache.py: the instances of one shape
share a key, each in its own directory ROOT/INSTANCE/KEY).

The instances role runs it on the host before it replaces an instance:

    python3 -m zenvllm.runtime compile-cache seed --root ROOT HERE [SIBLING ...]

HERE is filled from the first SIBLING that has files (one replaced before it in this
rollout and healthy since), as `cp -a` copies: modes, times and owners (the container's
user writes the cache). Nothing is written unless ROOT carries zenvllm's mark and every
path is inside it; HERE is left alone unless it is empty, and a copy that fails is
undone. Standard library only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from zenvllm.core import compile_cache
from zenvllm.core.errors import UserError
from zenvllm.runtime.compile_dirs import FIX, inside, marked


def filled(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def copy_tree(source: Path, dest: Path) -> None:
    """source's contents into dest, with modes, times and owners."""
    shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
    for top, dirs, files in os.walk(source):
        for name in dirs + files:
            there = Path(top) / name
            st = there.lstat()
            os.lchown(dest / there.relative_to(source), st.st_uid, st.st_gid)


def emptied(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def seed(root: Path, here: Path, siblings: list[Path]) -> Path | None:
    """The sibling HERE was filled from, or None when there was nothing to do."""
    if not marked(root):
        raise UserError(
            f"{root} has no {compile_cache.MARK_FILE} starting {compile_cache.MARK!r}: "
            f"zenvllm did not make it and writes nothing there; {FIX}"
        )
    here = inside(root, here)
    if not here.is_dir() or filled(here):
        return None
    for there in (inside(root, s) for s in siblings):
        if not filled(there):
            continue
        try:
            copy_tree(there, here)
        except OSError as err:
            emptied(here)
            raise UserError(
                f"could not copy the compile cache {there} into {here} ({err}); {here} was "
                "emptied again and its instance compiles at its start; free space there"
            ) from None
        return there
    return None
