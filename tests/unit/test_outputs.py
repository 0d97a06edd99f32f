"""Output paths: zenvllm replaces only directories it made, and refuses anything else
before any work, leaving it byte for byte as it was (`render --output`, `bench --out`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.cli import zenvllm

from zenvllm.core.errors import UserError
from zenvllm.deploy import outputs


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root (root included): kind, mode and content or link target."""
    entries = {}
    for path in [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]:
        st = path.lstat()
        if path.is_symlink():
            entries[str(path)] = ("link", os.readlink(path))
        elif path.is_dir():
            entries[str(path)] = ("dir", st.st_mode, st.st_ino)
        elif not path.is_file():  # a FIFO: never opened, it would block
            entries[str(path)] = ("special", st.st_mode, st.st_ino)
        else:
            entries[str(path)] = ("file", st.st_mode, st.st_ino, path.read_bytes())
    return entries


def foreign(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """(the path given to zenvllm, the tree that must stay as it was)."""
    home = tmp_path / "home"
    (home / "sub").mkdir(parents=True)
    (home / "notes.txt").write_text("my notes\n")
    (home / "sub" / "y").write_text("y\n")
    (tmp_path / "file.txt").write_text("a user's file\n")
    if kind == "dir":
        return home, tmp_path
    if kind == "file":
        return tmp_path / "file.txt", tmp_path
    if kind == "link-to-dir":
        (tmp_path / "link").symlink_to(home)
    elif kind == "link-to-file":
        (tmp_path / "link").symlink_to(tmp_path / "file.txt")
    elif kind == "empty-dir":
        (tmp_path / "empty").mkdir()
        return tmp_path / "empty", tmp_path
    elif kind == "fifo":
        os.mkfifo(tmp_path / "fifo")
        return tmp_path / "fifo", tmp_path
    elif kind in ("copied-context", "empty-marker", "changed"):
        ctx = tmp_path / "ctx"
        if kind == "changed":  # a directory zenvllm made, then the user's certificate added
            with outputs.staged(ctx, "--output") as staging:
                (staging / "Dockerfile").write_text("# Rendered by `zenvllm render` from d\n")
        else:  # a render copied by hand (names and header as zenvllm writes them)
            ctx.mkdir()
            (ctx / "Dockerfile").write_text("# zenvllm x\n# Rendered by `zenvllm render` from d\n")
            (ctx / "image.json").write_text("{}")
        if kind == "empty-marker":
            (ctx / outputs.MARKER).write_text("")
        (ctx / "certs").mkdir(exist_ok=True)
        (ctx / "certs" / "corp.crt").write_text("-----BEGIN CERTIFICATE-----\n")
        return ctx, tmp_path
    return tmp_path / "link", tmp_path


# The last three lost the user's certificate before the marker recorded SHA-256s.
KINDS = [
    "dir",
    "file",
    "link-to-dir",
    "link-to-file",
    "empty-dir",
    "fifo",
    "copied-context",
    "empty-marker",
    "changed",
]
VERBS = {
    "render": ["render", "--target", "vllm-openai", "--output"],
    # --out is checked before the model, the engine or anything else.
    "bench": ["bench", "--model", "/nonexistent", "--quick", "--out"],
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("verb", VERBS)
def test_a_path_zenvllm_did_not_make_is_refused_and_left_as_it_was(tmp_path, kind, verb):
    target, tree = foreign(tmp_path, kind)
    before = snapshot(tree)
    done = zenvllm(*VERBS[verb], str(target))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    option = "--output" if verb == "render" else "--out"
    assert f"{option} {target} is " in done.stderr  # the path and what is there
    assert "Give a path that does not exist yet, or remove that one first" in done.stderr
    assert snapshot(tree) == before


def test_a_failure_while_writing_leaves_the_old_output_and_no_staging(tmp_path):
    out = tmp_path / "out"
    with outputs.staged(out, "--out") as staging:
        (staging / "a").write_text("first\n")
    before = snapshot(out)
    with pytest.raises(KeyboardInterrupt), outputs.staged(out, "--out") as staging:
        (staging / "a").write_text("half")
        raise KeyboardInterrupt
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_owned_output_is_swapped_whole(tmp_path):
    out = tmp_path / "out"
    for text in ("one", "two"):
        with outputs.staged(out, "--out") as staging:
            (staging / text).write_text(text)
    assert sorted(p.name for p in out.iterdir()) == [outputs.MARKER, "two"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_ownership_is_proven_by_content_each_file_by_its_sha256(tmp_path):
    out = tmp_path / "ctx"
    with outputs.staged(out, "--output") as staging:
        (staging / "sub").mkdir()
        (staging / "sub" / "a").write_text("a\n")
    assert outputs.owned(out)
    marker = (out / outputs.MARKER).read_text().splitlines()
    assert marker[1:] == [
        "dir  sub",
        "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7  sub/a",
    ]
    (out / "sub" / "a").write_text("b\n")  # same name, other content: not what zenvllm wrote
    with pytest.raises(UserError, match=r"changed since \(changed sub/a\)"):
        outputs.check_output(out, "--output")
    outputs.remove_owned(out)
    assert (out / "sub" / "a").read_text() == "b\n"
