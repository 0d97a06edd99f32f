"""`python3 -m zenvllm.runtime preflight` (runtime/commands_preflight.py): the instances
role's one look, before it writes or starts anything, at what the plan would take from
the operator. Real files, sockets and processes of this machine; the engine's answer
from a stand-in binary (the roles' end-to-end test asks the real one)."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from zenvllm.runtime import commands_preflight, console
from zenvllm.runtime.commands_preflight import INSTANCE_HEADER, PROFILE_MARK, foreign

VERBS = (commands_preflight,)


def preflight(*args: str) -> int:
    return console.run(VERBS, ["preflight", "--deployment", "d", *args])


def test_only_zenvllms_marked_regular_files_are_its_own(tmp_path):
    ours = tmp_path / "zenvllm-0.env"
    ours.write_text("# Environment of zenvllm-0, written by zenvllm\nVLLM_CPU_KVCACHE_SPACE=1\n")
    script = tmp_path / "zenvllm-0.run.sh"
    script.write_text("#!/bin/sh\n# zenvllm instance zenvllm-0\nexec true\n")  # any line, as grep
    theirs = tmp_path / "theirs.env"
    theirs.write_text("# an operator's file\n")
    big = tmp_path / "big.env"
    big.write_bytes(b"x" * (1 << 20) + b"\n# zenvllm instance late\n")  # past the first MiB
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "nowhere")
    assert not foreign(tmp_path / "missing", INSTANCE_HEADER)
    assert not foreign(ours, INSTANCE_HEADER) and not foreign(script, INSTANCE_HEADER)
    assert foreign(theirs, INSTANCE_HEADER) and foreign(big, INSTANCE_HEADER)
    assert foreign(fifo, INSTANCE_HEADER)  # refused, never opened blocking
    assert foreign(tmp_path, INSTANCE_HEADER) and foreign(dangling, INSTANCE_HEADER)
    profile = tmp_path / "seccomp.json"
    profile.write_text('{"comment": "zenvllm: the engine\'s default plus get_mempolicy"}\n')
    assert not foreign(profile, PROFILE_MARK) and foreign(ours, PROFILE_MARK)


def test_every_refusal_is_named_with_its_fix_and_nothing_is_changed(tmp_path, capfd):
    theirs, mine = tmp_path / "zenvllm-0.env", tmp_path / "zenvllm-1.env"
    theirs.write_text("# an operator's file\n")
    mine.write_text("# Environment of zenvllm-1\n")
    profile = tmp_path / "seccomp.json"
    profile.write_text("{}\n")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (theirs, mine, profile)}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = [f"--file={theirs}", f"--file={mine}", f"--file={tmp_path / 'new.sh'}"]
        args += ["--profile", str(profile), "--port", str(port), "--base-port", str(port)]
        assert preflight(*args) == 2
    said = capfd.readouterr().err.splitlines()
    assert said == [
        f"{theirs} exist(s) and zenvllm did not write them (no zenvllm header); zenvllm never "
        "replaces a file it does not manage. Move them away, or choose another "
        "zenvllm_instances_deployment name.",
        f"Port {port} on 127.0.0.1 is already in use by something other than deployment d: "
        f"stop it, or move the instances with zenvllm_instances_base_port (now {port}).",
        f"{profile} exists and zenvllm did not write it; zenvllm never replaces a file it "
        "does not manage. Move it away, or give zenvllm_instances_seccomp_profile another path.",
    ]
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in before} == before
    assert not (tmp_path / "new.sh").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_plan_of_free_ports_and_its_own_files_passes(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("ZENVLLM_DOCKER", str(tmp_path / "no-engine-yet"))  # a fresh host
    ours = tmp_path / "zenvllm-0.service"
    ours.write_text("# zenvllm instance zenvllm-0\n[Service]\n")
    assert preflight(f"--file={ours}", "--port", str(free_port())) == 0
    assert capfd.readouterr().err == ""


def engine_showing(tmp_path, ports: str) -> str:
    """An engine binary whose `ps` lists these ports' labels, as docker's --format does."""
    binary = tmp_path / "engine"
    binary.write_text(f"#!/bin/sh\nprintf '{ports}'\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return str(binary)


def test_a_port_the_deployments_own_container_holds_is_its_to_take_over(
    tmp_path, capfd, monkeypatch
):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("ZENVLLM_DOCKER", engine_showing(tmp_path, f"{port}\\n\\n"))
        assert preflight("--port", str(port)) == 0
        monkeypatch.setenv("ZENVLLM_DOCKER", engine_showing(tmp_path, "9\\n"))
        assert preflight("--port", str(port)) == 2
    assert f"Port {port} on 127.0.0.1 is already in use" in capfd.readouterr().err


@pytest.mark.parametrize("bad", ["0", "65536", "80x", "-1"])
def test_a_port_out_of_range_is_refused_by_name(bad, capfd):
    assert preflight("--port", bad) == 2
    assert "--port" in capfd.readouterr().err
