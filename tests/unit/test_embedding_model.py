"""The tests' embedding model is fetched into a directory of its own: one that this did
not fetch (no marker, another marker, a symlink) is refused and left as it was."""

from __future__ import annotations

import pytest
from support import embedding_model


@pytest.mark.parametrize("kind", ["plain", "foreign-marker", "symlink"])
def test_a_directory_it_did_not_fetch_stays_untouched(tmp_path, kind):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text("{}")
    target = tmp_path / "model"
    if kind == "symlink":
        target.symlink_to(theirs)
    else:
        target = theirs
    if kind == "foreign-marker":
        (theirs / embedding_model.MARKER).write_text("mine, not zenvllm's\n")
    before = sorted((p.name, p.read_bytes()) for p in theirs.iterdir())
    with pytest.raises(SystemExit, match="is not a model tests/support made"):
        embedding_model.ensure_embedding_model(target)
    assert sorted((p.name, p.read_bytes()) for p in theirs.iterdir()) == before
    assert target.exists() and (kind != "symlink" or target.is_symlink())


def test_its_own_current_directory_is_kept_as_it_is(tmp_path):
    ours = tmp_path / "model"
    ours.mkdir()
    (ours / "config.json").write_text("{}")
    (ours / embedding_model.MARKER).write_text(embedding_model.SOURCE)
    assert embedding_model.fetched_here(ours) and embedding_model.is_current(ours)
    assert embedding_model.ensure_embedding_model(ours) == ours  # nothing fetched
