"""The background builds of `make test` (tests/support/prebuild.py) put their build steps
at idle priority only on an engine zenvllm started (scripts/engine.sh), never a host's."""

from __future__ import annotations

from support import prebuild


def test_only_an_engine_that_engine_sh_started_is_zenvllms(tmp_path):
    assert prebuild.started_by_engine_sh(prebuild.PRIVATE_SOCKET)
    assert not prebuild.started_by_engine_sh("unix:///var/run/docker.sock")
    # A second engine.sh engine (a fresh run's): its daemon.json and pidfile beside the socket.
    run = tmp_path / "zenvllm-fresh"
    run.mkdir()
    sock = f"unix://{run}/docker.sock"
    assert not prebuild.started_by_engine_sh(sock, runs=tmp_path)  # nothing of engine.sh's
    (run / "daemon.json").write_text("{}")
    assert not prebuild.started_by_engine_sh(sock, runs=tmp_path)
    (run / "dockerd.pid").write_text("1")
    assert prebuild.started_by_engine_sh(sock, runs=tmp_path)
    other = tmp_path / "docker"  # not a zenvllm* directory: a host's, whatever is in it
    other.mkdir()
    for name in ("daemon.json", "dockerd.pid"):
        (other / name).write_text("1")
    assert not prebuild.started_by_engine_sh(f"unix://{other}/docker.sock", runs=tmp_path)
