"""`python3 -m zenvllm.runtime compile-cache prepare` (runtime/compile_dirs.py), run as the
instances role runs it, on real directories: what it makes, what it leaves, what it
refuses; and the preflight's refusal of a compile cache directory zenvllm did not make."""

from __future__ import annotations

import os
from pathlib import Path

from support.cli import reported, runtime

from zenvllm.core import compile_cache
from zenvllm.runtime import compile_dirs

ME = f"{os.geteuid()}:{os.getegid()}"


def prepare(root: Path, *dirs: Path, owner: str = ME, dry_run: bool = False):
    argv = ["compile-cache", "prepare", "--root", str(root), "--owner", owner]
    return runtime(*argv, *map(str, dirs), *(["--dry-run"] if dry_run else []))


def keys(root: Path) -> list[Path]:
    return [root / "site-0" / ("a" * 16), root / "site-1" / ("b" * 16)]


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def test_a_fresh_root_is_made_marked_with_each_key_then_nothing_changes(tmp_path):
    root = tmp_path / "compile"
    wanted = keys(root)
    made = reported(prepare(root, *wanted))
    mark = root / compile_cache.MARK_FILE
    assert made == [str(root), str(mark), *(str(p) for k in wanted for p in (k.parent, k))]
    assert mark.read_text() == compile_dirs.MARK_TEXT
    assert mark.read_text().startswith(compile_cache.MARK)
    assert (mode(root), mode(mark)) == (0o755, 0o644)
    # An instance directory made for a key is made as the key is (Ansible's file module).
    assert [mode(p) for k in wanted for p in (k.parent, k)] == [0o700] * 4
    assert reported(prepare(root, *wanted)) == []


def test_a_root_whose_parents_are_missing_is_made_with_them(tmp_path):
    """/var/cache/zenvllm/compile on a fresh host: /var/cache/zenvllm is not there yet."""
    root = tmp_path / "var" / "cache" / "zenvllm" / "compile"
    assert reported(prepare(root, *keys(root), dry_run=True))[0] == str(root)
    assert not (tmp_path / "var").exists()
    assert reported(prepare(root, *keys(root)))[0] == str(root)
    assert mode(root.parent) == 0o755 and mode(root) == 0o755
    assert reported(prepare(root, *keys(root))) == []


def test_dry_run_says_what_it_would_make_and_writes_nothing(tmp_path):
    root = tmp_path / "compile"
    wanted = keys(root)
    would = reported(prepare(root, *wanted, dry_run=True))
    assert not root.exists()
    assert would == reported(prepare(root, *wanted))
    (root / compile_cache.MARK_FILE).write_text(f"{compile_cache.MARK} an older release's\n")
    wanted[0].chmod(0o755)
    assert reported(prepare(root, *wanted, dry_run=True)) == [
        str(root / compile_cache.MARK_FILE),
        str(wanted[0]),
    ]
    assert mode(wanted[0]) == 0o755
    assert reported(prepare(root, *wanted)) == [str(root / compile_cache.MARK_FILE), str(wanted[0])]
    assert mode(wanted[0]) == 0o700
    assert (root / compile_cache.MARK_FILE).read_text() == compile_dirs.MARK_TEXT


def test_an_existing_instance_directory_is_left_as_it_is(tmp_path):
    root = tmp_path / "compile"
    reported(prepare(root))
    (root / "site-0").mkdir(mode=0o755)
    (root / "site-0").chmod(0o751)
    made = reported(prepare(root, root / "site-0" / ("a" * 16)))
    assert made == [str(root / "site-0" / ("a" * 16))]
    assert mode(root / "site-0") == 0o751


def test_a_directory_zenvllm_did_not_make_is_refused_untouched(tmp_path):
    for mark in (None, "someone else's notes\n"):
        root = tmp_path / ("plain" if mark is None else "marked-otherwise")
        root.mkdir()
        (root / "notes.txt").write_text("an operator's files\n")
        if mark is not None:
            (root / compile_cache.MARK_FILE).write_text(mark)
        done = prepare(root, *keys(root))
        assert done.returncode == 2 and done.stdout == ""
        assert f"{root} exists and zenvllm did not make it" in done.stderr
        assert "zenvllm_instances_compile_cache_dir another path" in done.stderr
        assert "Traceback" not in done.stderr
        assert sorted(p.name for p in root.iterdir()) == sorted(
            ["notes.txt"] + ([compile_cache.MARK_FILE] if mark else [])
        )
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    done = prepare(a_file)
    assert done.returncode == 2 and f"{a_file} exists and zenvllm did not make it" in done.stderr


def test_a_link_where_a_directory_goes_and_a_path_outside_are_refused(tmp_path):
    root = tmp_path / "compile"
    reported(prepare(root))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "site-0").symlink_to(elsewhere)  # out of ROOT once followed
    done = prepare(root, root / "site-0" / ("a" * 16))
    assert done.returncode == 2, done.stdout
    assert "is not inside the compile cache directory" in done.stderr
    assert list(elsewhere.iterdir()) == []
    (root / "other").mkdir()
    (root / "site-1").symlink_to(root / "other")  # inside ROOT, but not a directory of its own
    done = prepare(root, root / "site-1" / ("b" * 16))
    assert done.returncode == 2, done.stdout
    assert f"{root / 'site-1'} is a symbolic link, not a directory" in done.stderr
    assert list((root / "other").iterdir()) == []
    done = prepare(root, tmp_path / "site-9" / ("c" * 16))
    assert done.returncode == 2
    assert "is not inside the compile cache directory" in done.stderr
    assert not (tmp_path / "site-9").exists()


def test_an_owner_the_host_does_not_know_is_named(tmp_path):
    root = tmp_path / "compile"
    done = prepare(root, *keys(root), owner="no-such-user-zenvllm:no-such-group")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--owner no-such-user-zenvllm:no-such-group: no such user or group" in done.stderr
    assert not root.exists()


def test_preflight_refuses_a_compile_cache_directory_zenvllm_did_not_make(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    ours = tmp_path / "ours"
    reported(prepare(ours))
    argv = ["preflight", "--deployment", "site", "--compile-cache"]
    assert runtime(*argv, str(ours)).returncode == 0
    assert runtime(*argv, str(tmp_path / "not-yet")).returncode == 0
    refused = runtime(*argv, str(theirs))
    assert refused.returncode == 2
    assert f"{theirs} exists and zenvllm did not make it" in refused.stderr
    assert list(theirs.iterdir()) == []
