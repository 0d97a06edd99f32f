"""The tutorial and README's two commands on this machine, run as written: `make deploy`
from the checkout's root, README's and the tutorial's curl to the endpoint it made, and
`make undeploy`, which leaves the machine's files as they were. The one placeholder is
the model's path: a directory named as the docs' model (so the served name they ask for
is its name) holding the tiny model. The controller's home is a directory of the test's,
so the key store is `~/.config/zenvllm/zenvllm` there, where the docs look.

README's block holds `make test` too: CI's own command (.ci/run, checked by
tests/unit/test_docs.py), which a test of the suite cannot run inside itself."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, require
from support import engine, gateway, readme
from support.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.ansible

MODEL_PATH = "/srv/models/Qwen2.5-1.5B-Instruct"  # the tutorial's; README's curl names it
WATCHED = [Path("/etc/fstab"), Path("/etc/sysctl.d")]  # the host role's, on a real host


def snapshot() -> dict[str, str]:
    files = [p for w in WATCHED for p in ([w] if w.is_file() else sorted(w.glob("*")))]
    return {str(p): p.read_text() for p in files if p.is_file()}


@pytest.fixture(scope="module")
def operator(tmp_path_factory):
    """An operator's shell on this machine: their own home, nothing of the tests' set."""
    require(engine.engine_ready(), "no container engine answers on DOCKER_HOST (make engine)")
    require(os.geteuid() == 0, "make deploy needs root")
    home = tmp_path_factory.mktemp("operator-home")
    model = home / "models" / Path(MODEL_PATH).name
    shutil.copytree(ensure_tiny_model(), model)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZENVLLM_SECRETS", "ANSIBLE"))}
    env |= {"HOME": str(home), "DOCKER_HOST": engine.engine_env()["DOCKER_HOST"]}
    before = snapshot()
    # make deploy starts nginx and undeploy leaves it (it may serve others): stopped again
    # after, as the machine had it, for the modules that need it not running.
    with gateway.nginx_as_found():
        yield env, {MODEL_PATH: str(model)}, before
        subprocess.run(["make", "undeploy"], cwd=REPO, env=env, capture_output=True, check=False)


def test_make_deploy_serves_the_model_as_readme_says(operator):
    env, model, _ = operator
    start = time.monotonic()
    # README's second line is CI's own `make test`: ":" keeps it from running in itself.
    placeholders = {"/path/to/hf-model": model[MODEL_PATH], "make test ": ": make test "}
    deploy = readme.run("two-commands", placeholders, env=env, timeout=1500)
    print(f"make deploy: {time.monotonic() - start:.0f} s")
    assert deploy.returncode == 0, deploy.stdout[-6000:] + deploy.stderr[-3000:]
    assert "Qwen2.5-1.5B-Instruct answered through the gateway" in deploy.stdout
    keys = Path(env["HOME"]) / ".config" / "zenvllm" / "zenvllm"
    assert (keys / "keys" / "default").is_file() and (keys / "localhost-ca.pem").is_file()


def test_the_tutorials_make_deploy_again_changes_nothing(operator):
    env, model, _ = operator
    again = readme.run("tutorial-deploy", model, env=env, timeout=1500)
    assert again.returncode == 0, again.stdout[-6000:] + again.stderr[-3000:]
    assert re.search(r"^localhost +: ok=\d+ +changed=0 ", again.stdout, re.M), again.stdout[-3000:]


@pytest.mark.parametrize("name", ["readme-call", "tutorial-call"])
def test_the_docs_call_the_endpoint_as_written(operator, name):
    env, _, _ = operator
    done = readme.run(name, env=env)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["model"] == "Qwen2.5-1.5B-Instruct", answer
    assert 1 <= answer["usage"]["completion_tokens"] <= 16


def test_the_plan_the_tutorial_shows_is_the_one_deployed(operator):
    env, model, _ = operator
    done = readme.run("tutorial-plan", model, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    deployed = engine.docker("ps", "--filter", "label=zenvllm.deployment=zenvllm", "-q")
    planned = [line for line in done.stdout.splitlines() if line.startswith("zenvllm-")]
    assert len(planned) == len(deployed.stdout.split()) >= 1, done.stdout


def test_make_deploy_takes_several_models_as_models(operator, tmp_path):
    """`make deploy MODELS="chat=DIR embed=DIR"`, previewed (DEPLOY_ARGS=--check): the
    play plans both models of the list, named as it names them, behind one endpoint."""
    env, model, _ = operator
    other = tmp_path / "second"
    shutil.copytree(model[MODEL_PATH], other)
    models = f"MODELS=chat={model[MODEL_PATH]} other={other}"
    done = subprocess.run(
        ["make", "deploy", models, "DEPLOY_ARGS=--check"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"instance\(s\) of chat, other on ", done.stdout), done.stdout[-4000:]


def test_make_undeploy_leaves_the_machine_as_it_found_it(operator):
    env, _, before = operator
    done = readme.run("tutorial-undeploy", env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    left = engine.docker("ps", "-aq", "--filter", "label=zenvllm.deployment=zenvllm")
    assert left.stdout.strip() == ""
    assert snapshot() == before
    assert not Path("/etc/nginx/conf.d/zenvllm.conf").exists()
