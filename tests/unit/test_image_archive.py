"""The test hosts' image archive cache (tests/support/engine.image_archive): it replaces
only archives it wrote, proven by their manifest, never a file that only has the name."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from support import engine

TAG = "zenvllm/vllm-openai:0.32.0"
STEM = "zenvllm_vllm-openai_0.32.0"


def saved(path: Path, tag: str) -> Path:
    """A file laid out as `docker save` writes one: a tar with manifest.json naming tag."""
    body = json.dumps([{"Config": "c.json", "RepoTags": [tag], "Layers": []}]).encode()
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return path


def test_only_a_docker_save_archive_of_the_tag_counts_as_one(tmp_path):
    assert engine.saved_archive_of(saved(tmp_path / "a.tar", TAG), TAG)
    assert not engine.saved_archive_of(saved(tmp_path / "b.tar", "theirs:1"), TAG)
    (tmp_path / "c.tar").write_text("the operator's notes\n")
    assert not engine.saved_archive_of(tmp_path / "c.tar", TAG)
    assert not engine.saved_archive_of(tmp_path / "missing.tar", TAG)


def test_a_new_build_replaces_its_older_archive_and_leaves_the_rest(tmp_path, monkeypatch):
    cache = tmp_path / "archives"
    cache.mkdir()
    older = saved(cache / f"{STEM}-0123456789ab.tar", TAG)
    theirs = cache / f"{STEM}-mine.tar"
    theirs.write_text("not an archive, only the name\n")
    other = saved(cache / f"{STEM}-feedfacecafe.tar", "another:tag")
    monkeypatch.setenv("ZENVLLM_CACHE", str(tmp_path))
    monkeypatch.setattr(engine, "image_id", lambda tag: "sha256:" + "ab" * 32)

    def docker_save(*args, **kwargs):
        assert args[:2] == ("save", "-o") and args[3] == TAG
        saved(Path(args[2]), TAG)

    monkeypatch.setattr(engine, "docker", docker_save)
    made = engine.image_archive(TAG)
    assert made == cache / f"{STEM}-abababababab.tar" and engine.saved_archive_of(made, TAG)
    assert not older.exists()
    assert theirs.read_text() == "not an archive, only the name\n" and other.exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted([made.name, theirs.name, other.name])

    def no_save(*args, **kwargs):
        raise AssertionError("saved again")

    monkeypatch.setattr(engine, "docker", no_save)
    assert engine.image_archive(TAG) == made  # kept: no second save
