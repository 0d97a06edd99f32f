"""The one engine edge (runtime/engine.py): every command of the package, the bench's
and `zenvllm status`'s alike, runs the binary ZENVLLM_DOCKER names (docker by default),
and a missing one is a UserError that says how to get one."""

from __future__ import annotations

import pytest

from zenvllm.core.errors import UserError
from zenvllm.runtime import engine, status


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """An engine binary that prints its arguments (and fails on `fail`)."""
    binary = tmp_path / "fake-docker"
    binary.write_text('#!/bin/sh\n[ "$1" = fail ] && { echo refused >&2; exit 3; }\necho "$@"\n')
    binary.chmod(0o755)
    monkeypatch.setenv("ZENVLLM_DOCKER", str(binary))
    return binary


def test_the_binary_is_docker_unless_zenvllm_docker_names_another(fake_engine, monkeypatch):
    assert engine.Cli().binary == str(fake_engine)
    assert engine.Cli().run("ps", "-a").stdout == "ps -a\n"
    assert engine.Cli().words("image", "ls") == ["image", "ls"]
    monkeypatch.delenv("ZENVLLM_DOCKER")
    assert engine.Cli().binary == "docker"


def test_status_asks_the_same_engine_and_names_a_failure(fake_engine):
    assert status.docker("inspect", "x") == "inspect x\n"
    with pytest.raises(UserError, match=r"fake-docker fail x: refused; is this host's engine"):
        status.docker("fail", "x")


def test_a_missing_binary_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv("ZENVLLM_DOCKER", str(tmp_path / "no-such-engine"))
    with pytest.raises(UserError, match="no-such-engine not found; run `make engine`"):
        engine.Cli().run("ps")
    with pytest.raises(UserError, match=r"no-such-engine ps: .*not found"):
        status.docker("ps")
