"""README's quick start 1 and the tutorial's "serve without Ansible", run as written (but
for the model's path, and the engine's socket where the tutorial names the project's
own: support/readme.py) against the built vllm-openai image: each serves the tiny model
on port 8000 and answers a completion. Each starts vLLM cold in its default compiled
mode, as a reader's first run does."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from conftest import require
from support import engine, readme
from support.tiny_model import ensure_tiny_model

from zenvllm.runtime.health import healthy

pytestmark = pytest.mark.serve

PORT = 8000  # the docs' own
IMAGE = "zenvllm/vllm-openai:0.32.0"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")
    if engine.docker("image", "inspect", IMAGE, check=False).returncode != 0:
        engine.build("vllm-openai", tmp_path_factory.mktemp("build") / "build.log")
    return ensure_tiny_model()


def containers_on(model) -> set[str]:
    """This engine's containers that mount the model (the docs' name none of them)."""
    found = engine.docker("ps", "-aq", "--no-trunc", "--filter", f"volume={model}")
    return set(found.stdout.split())


def test_quick_start_1_serves_on_port_8000(model):
    assert not healthy(PORT), f"port {PORT} answers before the test: another server holds it"
    before = containers_on(model)
    text = readme.written("quick-start-1", {"/srv/models/m": str(model)})
    server = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", text],
        env=os.environ | engine.engine_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 420
        while not healthy(PORT):
            assert server.poll() is None, f"it stopped:\n{server.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, "not ready in 420 s"
            time.sleep(2)
        body = {"model": "/model", "prompt": "Hello", "max_tokens": 8, "ignore_eos": True}
        reply = engine.http_json(f"http://127.0.0.1:{PORT}/v1/completions", body)
        assert reply["usage"]["completion_tokens"] == 8
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the docker client stops its container (--rm)
        try:
            server.wait(120)
        finally:
            for left in containers_on(model) - before:
                engine.docker("rm", "--force", left, check=False)
    assert containers_on(model) == before  # --rm: nothing left behind


def test_the_tutorial_serves_asks_and_removes_its_container(model):
    assert not healthy(PORT), f"port {PORT} answers before the test: another server holds it"
    socket = engine.engine_env()["DOCKER_HOST"]
    placeholders = {"/srv/models/m": str(model), "unix:///run/zenvllm/docker.sock": socket}
    try:
        done = readme.run("tutorial-serve", placeholders, timeout=600)
    finally:
        engine.docker("rm", "--force", "zenvllm-try", check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    answer = done.stdout[done.stdout.index('{"id"') :].splitlines()[0]
    assert '"completion_tokens"' in answer and '"/model"' in answer, answer
    assert engine.docker("inspect", "zenvllm-try", check=False).returncode != 0  # removed
