"""The serve tier's kept compile caches (tests/support/engine.py): only a directory
bearing compile_cache's mark is ever removed; a plain directory, a foreign mark and a
symlink stay untouched."""

from __future__ import annotations

from support import engine

from zenvllm.core import compile_cache


def test_only_a_marked_directory_is_ours(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / compile_cache.MARK_FILE).write_text(f"{compile_cache.MARK} caches of image x\n")
    plain = tmp_path / "plain"
    plain.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / compile_cache.MARK_FILE).write_text("someone else's notes\n")
    link = tmp_path / "link"
    link.symlink_to(ours)
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    (fifo_dir / compile_cache.MARK_FILE).mkdir()  # not a file
    assert engine.marked(ours)
    assert not any(engine.marked(d) for d in (plain, foreign, link, fifo_dir))
    assert not engine.marked(tmp_path / "absent")
