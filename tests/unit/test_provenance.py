"""Image provenance: the OCI labels of where an image comes from.

The labels must be a function of the sources alone: a rebuild of an unchanged tree has
to stay a layer-cache hit. Pure functions first, then the one git call against a real
repository made here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from zenvllm import __version__
from zenvllm.core.errors import UserError
from zenvllm.image import peers, provenance, render

OCI = "org.opencontainers.image"
SHA = "f01c77ef025b3433a14e17f36ea6ce78e7f0188e"


def test_the_log_line_is_a_commit_and_anything_else_is_none():
    assert provenance.parse_log(f"{SHA} 1795503522\n") == provenance.Commit(SHA, 1795503522)
    for text in ("", "\n", f"{SHA}", f"{SHA} soon", f"{SHA} ²", "a b c"):
        assert provenance.parse_log(text) is None, text


def test_source_date_epoch_is_whole_seconds_or_refused():
    assert provenance.source_date_epoch(None) is None
    assert provenance.source_date_epoch("") is None
    assert provenance.source_date_epoch("1700000000") == 1700000000
    for bad in ("soon", "-1", "1.5", " 1", "²", "0x10"):
        with pytest.raises(UserError, match=r"SOURCE_DATE_EPOCH=.*whole number of seconds"):
            provenance.source_date_epoch(bad)


def test_dates_are_rfc3339_in_utc():
    assert provenance.rfc3339(0) == "1970-01-01T00:00:00Z"
    assert provenance.rfc3339(1795503522) == "2026-11-24T06:58:42Z"


def test_labels_from_a_commit_a_date_override_and_no_checkout():
    commit = provenance.Commit(SHA, 1795503522)
    got = provenance.labels(commit, "0.1.0", None, "zenvllm/debian:bookworm")
    assert got == {
        f"{OCI}.source": provenance.PROJECT_URL,
        f"{OCI}.revision": SHA,
        f"{OCI}.licenses": "Apache-2.0",
        f"{OCI}.base.name": "zenvllm/debian:bookworm",
        f"{OCI}.created": "2026-11-24T06:58:42Z",
    }
    # SOURCE_DATE_EPOCH wins over the commit's date; the revision stays the commit.
    pinned = provenance.labels(commit, "0.1.0", 0, "b")
    assert (pinned[f"{OCI}.created"], pinned[f"{OCI}.revision"]) == ("1970-01-01T00:00:00Z", SHA)
    # An installed package (no git): its version, and no date rather than now.
    bare = provenance.labels(None, "0.1.0", None, "b")
    assert bare[f"{OCI}.revision"] == "0.1.0" and f"{OCI}.created" not in bare
    assert provenance.labels(None, "0.1.0", 60, "b")[f"{OCI}.created"] == "1970-01-01T00:01:00Z"


def _git(repo: Path, *args: str, when: int = 1700000000) -> str:
    stamp = f"@{when} +0200"  # a committer abroad: the label still says UTC
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_DATE": stamp,
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_the_revision_is_the_last_commit_of_the_sources_not_of_the_tree(tmp_path, monkeypatch):
    repo = tmp_path / "checkout"
    (repo / "dockerfiles").mkdir(parents=True)
    (repo / "docs").mkdir()
    _git(repo, "init", "-q")
    (repo / "dockerfiles" / "build.yaml").write_text("pins: {}\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "image", when=1700000000)
    image = _git(repo, "rev-parse", "HEAD")
    (repo / "docs" / "x.md").write_text("words\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "docs", when=1700009999)
    sources = [repo / "dockerfiles"]
    # The docs commit is newer but touched nothing the image holds.
    assert provenance.last_commit(sources) == provenance.Commit(image, 1700000000)
    assert provenance.last_commit([*sources, repo / "docs"]).epoch == 1700009999
    # Untracked, missing or outside any checkout: no commit (the version is used).
    (repo / "new").mkdir()
    assert provenance.last_commit([repo / "new"]) is None
    assert provenance.last_commit([repo / "missing"]) is None
    assert provenance.last_commit([Path("/proc/self")]) is None
    # A caller's GIT_DIR (a git hook) must not point the query at another repository.
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    assert provenance.last_commit(sources) == provenance.Commit(image, 1700000000)


def test_the_image_sources_are_real_paths_of_what_images_copy():
    sources = provenance.image_sources()
    assert all(p.exists() and not p.is_symlink() for p in sources)
    assert any((p / "build.yaml").is_file() for p in sources)
    names = {p.name for p in sources}
    assert {"__init__.py", "core", "runtime"} <= names
    assert [p.name for p in provenance.image_sources(peer=True)] == [sources[0].name]


def test_origin_reads_source_date_epoch_and_refuses_a_bad_one():
    got = provenance.origin("zenvllm/debian:bookworm", environ={"SOURCE_DATE_EPOCH": "86400"})
    assert got[f"{OCI}.created"] == "1970-01-02T00:00:00Z"
    assert got[f"{OCI}.revision"] in (__version__, *_commits_here())
    with pytest.raises(UserError, match="SOURCE_DATE_EPOCH"):
        provenance.origin("b", environ={"SOURCE_DATE_EPOCH": "yesterday"})


def _commits_here() -> list[str]:
    here = Path(__file__).resolve().parent
    done = subprocess.run(
        ["git", "-C", str(here), "log", "--format=%H"], capture_output=True, text=True
    )
    return done.stdout.split()


ORIGIN = provenance.labels(provenance.Commit(SHA, 0), "0.1.0", None, "zenvllm/debian:bookworm")


def test_the_origin_is_rendered_into_the_label_of_targets_and_peers():
    config = render.load_config()
    ctx = render.render(config, render.Request("vllm-openai", origin=ORIGIN))
    assert ORIGIN.items() <= ctx.labels.items()
    assert f'{OCI}.revision="{SHA}"' in ctx.files["Dockerfile"]
    assert ctx.labels["io.zenvllm.pin.vllm"] == "0.32.0"  # the per-pin labels stay
    peer = peers.render_peer(config, render.Request("llamacpp", origin=ORIGIN), "k")
    assert ORIGIN.items() <= peer.labels.items()
    assert f'{OCI}.created="1970-01-01T00:00:00Z"' in peer.files["Dockerfile"]
