"""`python3 -m zenvllm.runtime compile-cache seed` (runtime/compile_seed.py), run as the
instances role runs it, on real directories: what it copies, and what it refuses."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support.cli import runtime

from zenvllm.core import compile_cache


def seed(root: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    return runtime("compile-cache", "seed", "--root", str(root), *map(str, paths))


def cache_root(tmp: Path, mark: str = compile_cache.MARK) -> Path:
    root = tmp / "compile"
    for instance in ("a", "b", "c"):
        (root / instance / "k1").mkdir(parents=True)
    (root / compile_cache.MARK_FILE).write_text(f"{mark} vLLM compile caches\n")
    return root


def fill(here: Path) -> None:
    (here / "inductor/ab").mkdir(parents=True)
    (here / "inductor/ab/kernel.so").write_bytes(b"\x7fELF" + bytes(100))
    (here / "inductor/ab/kernel.so").chmod(0o640)
    (here / "torch_compile_cache").mkdir()
    (here / "torch_compile_cache/graph").write_text("graph")
    (here / "latest").symlink_to("inductor/ab")
    if os.geteuid() == 0:  # the container's user owns what it wrote
        for path in (here / "inductor", here / "inductor/ab", here / "inductor/ab/kernel.so"):
            os.lchown(path, 10001, 10001)


def test_an_empty_directory_is_filled_from_the_first_filled_sibling(tmp_path):
    root = cache_root(tmp_path)
    here, empty, filled = root / "c/k1", root / "a/k1", root / "b/k1"
    fill(filled)
    done = seed(root, here, empty, filled)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"changed": True, "from": str(filled)}
    kernel = here / "inductor/ab/kernel.so"
    assert kernel.read_bytes() == (filled / "inductor/ab/kernel.so").read_bytes()
    assert kernel.stat().st_mode & 0o777 == 0o640
    assert (here / "latest").readlink() == Path("inductor/ab")
    if os.geteuid() == 0:
        assert (kernel.stat().st_uid, (here / "inductor/ab").stat().st_uid) == (10001, 10001)
    again = seed(root, here, empty, filled)  # filled now: nothing to do
    assert json.loads(again.stdout) == {"changed": False, "from": None}


def test_nothing_to_copy_changes_nothing(tmp_path):
    root = cache_root(tmp_path)
    done = seed(root, root / "c/k1", root / "a/k1", root / "b/k1", root / "gone/k1")
    assert (done.returncode, json.loads(done.stdout)["changed"]) == (0, False)
    assert not any((root / "c/k1").iterdir())


def test_a_directory_zenvllm_did_not_mark_is_refused_untouched(tmp_path):
    root = cache_root(tmp_path, mark="theirs:")
    fill(root / "b/k1")
    done = seed(root, root / "c/k1", root / "b/k1")
    assert done.returncode == 2 and not done.stdout
    assert f"{root} has no {compile_cache.MARK_FILE}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not any((root / "c/k1").iterdir())


def test_a_path_outside_the_directory_is_refused(tmp_path):
    root = cache_root(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (root / "c/escape").symlink_to(theirs)
    fill(root / "b/k1")
    done = seed(root, root / "c/escape", root / "b/k1")
    assert done.returncode == 2, done.stderr
    assert f"{root / 'c/escape'} is not inside the compile cache directory" in done.stderr
    assert not any(theirs.iterdir())


def test_a_copy_that_fails_is_undone_and_named(tmp_path):
    root = cache_root(tmp_path)
    there = root / "b/k1"
    fill(there)
    os.mkfifo(there / "torch_compile_cache/pipe")  # copyfile refuses a named pipe
    done = seed(root, root / "c/k1", there)
    assert done.returncode == 2, done.stderr
    assert f"could not copy the compile cache {there} into {root / 'c/k1'}" in done.stderr
    assert "emptied again" in done.stderr and "Traceback" not in done.stderr
    assert not any((root / "c/k1").iterdir())
