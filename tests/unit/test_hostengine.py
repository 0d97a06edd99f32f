"""Which engine zenvllm uses on an operator's host: every branch of hostengine.decide,
and the file's promise to the host role that it runs alone (nothing of zenvllm)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zenvllm.runtime import hostengine
from zenvllm.runtime.hostengine import Facts, decide


def facts(*installed, answers=False, systemd=True, ours=(), docker_host="") -> Facts:
    return Facts(tuple(installed), answers, systemd, tuple(ours), docker_host, "27.3.1")


def test_dockers_own_engine_is_used_and_nothing_installed():
    choice = decide(facts("docker-ce", "docker-ce-cli", "containerd.io", answers=True))
    assert (choice.action, choice.packages, choice.unit, choice.manage) == (
        "use",
        (),
        "docker.service",
        False,
    )
    assert choice.engine == "docker-ce (27.3.1)"


@pytest.mark.parametrize("installed", [("docker-ce", "containerd.io"), ("docker.io",)])
def test_an_operators_engine_that_does_not_answer_is_refused_not_started(installed):
    choice = decide(facts(*installed))
    assert choice.action == "refuse"
    assert f"{installed[0]} is installed but no engine answers" in choice.message
    assert "zenvllm_docker_host" in choice.message and "systemctl enable --now docker" in (
        choice.message
    )


def test_debians_engine_that_zenvllm_installed_is_started_and_kept_enabled():
    assert decide(facts("docker.io", "containerd", "runc", ours=["docker.io"])).action == "start"
    used = decide(facts("docker.io", "containerd", "runc", answers=True, ours=["docker.io"]))
    assert (used.action, used.manage) == ("use", True)
    theirs = decide(facts("docker.io", "containerd", "runc", answers=True))
    assert (theirs.action, theirs.manage) == ("use", False)


def test_a_host_with_no_engine_gets_debians():
    choice = decide(facts())
    assert choice.action == "install" and choice.packages == ("docker.io", "containerd", "runc")
    assert choice.manage and choice.unit == "docker.service"
    assert decide(facts("runc")).packages == ("docker.io", "containerd")


@pytest.mark.parametrize(
    ("package", "conflict"),
    [
        ("containerd.io", "containerd and runc (containerd.io declares Conflicts"),
        ("docker-ce-cli", "docker.io (it declares Conflicts: docker-ce-cli)"),
    ],
)
def test_a_conflicting_package_is_named_before_anything_is_installed(package, conflict):
    choice = decide(facts(package))
    assert choice.action == "refuse" and not choice.packages
    assert f"but {package} is installed and conflicts with {conflict}" in choice.message
    assert "zenvllm_host_engine=external" in choice.message


def test_distribution_mode_refuses_beside_docker_ce_even_when_it_answers():
    choice = decide(facts("docker-ce", "containerd.io", answers=True), "distribution")
    assert choice.action == "refuse"
    assert "zenvllm_host_engine=distribution installs Debian's" in choice.message
    assert "docker-ce is installed and conflicts with docker.io" in choice.message
    assert decide(facts("docker.io", "containerd", "runc"), "distribution").action == "start"


def test_external_mode_installs_nothing_and_needs_an_answer():
    assert decide(facts(answers=True), "external").action == "use"
    refused = decide(facts(docker_host="unix:///srv/theirs.sock"), "external")
    assert refused.action == "refuse" and "unix:///srv/theirs.sock" in refused.message


def test_without_systemd_only_make_starts_a_private_engine():
    assert decide(facts(systemd=False), private_ok=True).packages == hostengine.DISTRIBUTION
    assert decide(facts("docker.io", systemd=False), private_ok=True).action == "private"
    role = decide(facts(systemd=False))
    assert role.action == "refuse" and "systemd is not PID 1" in role.message
    assert decide(facts("containerd.io", systemd=False), private_ok=True).action == "refuse"
    # What answers is used either way, the private engine included.
    assert decide(facts("docker.io", systemd=False, answers=True)).action == "use"


def test_an_unknown_mode_is_refused_by_name():
    assert "zenvllm_host_engine='edge'" in decide(facts(), "edge").message


def test_records_are_read_by_content(tmp_path):
    (tmp_path / "docker.io").write_text(hostengine.RECORD_TEXT)
    (tmp_path / "containerd").write_text("someone else's note\n")
    (tmp_path / "runc").write_bytes(b"\xff\xfe")
    os.mkfifo(tmp_path / "podman-docker")  # read, it would block forever
    packages = ("docker.io", "containerd", "runc", "podman-docker")
    assert hostengine.recorded(packages, str(tmp_path)) == ("docker.io",)


def test_the_file_runs_as_make_runs_it_importing_only_the_engine_edge(tmp_path):
    """`make` and engine.sh run the file with the system's python3 before any venv:
    of zenvllm it imports only the engine edge (standard library only), found beside it."""
    source = Path(hostengine.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    ours = {n for n in names if n.startswith("zenvllm")}
    assert ours == {"zenvllm.runtime.engine", "zenvllm.core.errors"}, ours
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [
            sys.executable,
            hostengine.__file__,
            "decide",
            "--json",
            "--docker-host",
            "unix:///nowhere",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=clean,
    )
    choice = json.loads(out.stdout)
    assert choice["facts"]["answers"] is False and choice["facts"]["docker_host"] == (
        "unix:///nowhere"
    )
    external = ["decide", "--mode", "external", "--docker-host", "unix:///x"]
    refused = subprocess.run(
        [sys.executable, hostengine.__file__, *external],
        env=clean,
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2 and "engine: zenvllm_host_engine=external" in refused.stderr
