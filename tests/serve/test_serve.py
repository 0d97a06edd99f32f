"""A real completion from each image, run the way a user runs it.

`docker run IMAGE --model /model` with the tiny model mounted read-only, in
vLLM's default compiled mode (torch.compile with Inductor, and for `zen` the
ZenCpuPlatform's zentorch linear ops where the CPU has AVX-512 BF16). Only the
launcher sizes the instance (no VLLM_CPU_* env is passed): the test checks the
planned values in its log, then sends a real /v1/completions and checks the
token counts against the model's own tokenizer.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from conftest import require
from support import engine
from support.cpu import has_amx
from support.tiny_model import ensure_tiny_model

from zenvllm.runtime.health import healthy

pytestmark = pytest.mark.serve

MAX_TOKENS = 9
PROMPT = "Hello world, the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module", params=["vllm-openai", "zen"])
def image(request, tmp_path_factory) -> str:
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")
    tag, _ = engine.build(request.param, tmp_path_factory.mktemp("logs") / "build.log")
    return tag


@pytest.fixture(scope="module")
def server(image):
    model = ensure_tiny_model()
    port = engine.free_port()
    start = time.monotonic()
    # The project's engine gives containers 1 GiB of /dev/shm (Docker's default is 64 MiB).
    with engine.serve(image, model, port, run_opts=("--health-interval=5s",)) as name:
        engine.wait_for(
            lambda: healthy(port) or "initialization failed" in engine.logs(name),
            420,
            "/health",
            name,
            every=2,
        )
        assert healthy(port), engine.logs(name)
        print(f"server ready in {time.monotonic() - start:.0f} s")
        yield name, port, model


def test_launcher_planned_the_container(server):
    name, _, _ = server
    log = engine.logs(name)
    assert re.search(r"zenvllm-launch: VLLM_CPU_KVCACHE_SPACE=\d+ \(planned\)", log)
    assert re.search(r"zenvllm-launch: VLLM_CPU_OMP_THREADS_BIND=[\d,-]+ \(planned\)", log)
    assert "zenvllm-launch: LD_PRELOAD ok:" in log
    assert "zenvllm-launch: exec vllm serve /model" in log
    # AMX tiles asked for at the interpreter's start exactly where this CPU has them.
    amx = "requested at interpreter start (zenvllm.pth) and granted" if has_amx() else "not on"
    assert re.search(rf"zenvllm-launch: AMX: .*{re.escape(amx)}", log), log


def test_completion_has_the_requested_tokens(server):
    from tokenizers import Tokenizer

    name, port, model = server
    body = {
        "model": "/model",
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
    }
    try:  # the first bf16 request is where a missing AMX permission killed the worker
        reply = engine.http_json(f"http://127.0.0.1:{port}/v1/completions", body)
    except OSError as err:
        log = engine.logs(name)
        raise AssertionError(f"the completion failed ({err}); server log:\n{log}") from err
    usage = reply["usage"]
    prompt_ids = Tokenizer.from_file(str(Path(model) / "tokenizer.json")).encode(PROMPT).ids
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["prompt_tokens"] == len(prompt_ids)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["choices"][0]["text"]


def test_image_healthcheck_reports_healthy(server):
    name, _, _ = server
    status = engine.wait_for(
        lambda: (
            engine.docker("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()
            == "healthy"
        ),
        60,
        "docker's health status",
        name,
    )
    assert status


def test_without_enough_shm_the_launcher_refuses_with_the_fix(image):
    # 64m is docker's stock default; the test engine itself defaults to 1g.
    done = engine.docker(
        "run",
        "--rm",
        "--network",
        "host",
        "--shm-size=64m",
        image,
        "--model",
        "/nowhere",
        check=False,
    )
    assert done.returncode == 2
    assert "vLLM needs at least 512 MiB" in done.stderr
    assert "--shm-size=" in done.stderr
