"""Quantized models from the images: AWQ and GPTQ INT4, compressed-tensors W8A8 INT8.

Each tiny model (made offline in the real on-disk format, tests/support/quant_model.py)
is served by `docker run IMAGE --model /model` where this CPU can run its kernel, and
a completion must return exactly max_tokens tokens from a container Docker calls
healthy. Where it cannot (INT4 without AVX-512), the launcher must refuse with the
reason and the way out; a faked AVX2-only cpuinfo shows that branch on any machine.
The expectation comes from the real CPU's flags, never from its vendor.
"""

from __future__ import annotations

import time

import pytest
from conftest import require
from support import cpu, engine
from support.quant_model import FORMATS, ensure_quant_model

from zenvllm.core.model import read_model
from zenvllm.runtime.health import healthy

pytestmark = pytest.mark.serve

MAX_TOKENS = 7
# zen for the format zentorch runs (W8A8), where zentorch is active: elsewhere its
# launcher refuses (tests/image), and INT4 there runs vLLM's own kernel, as above.
CASES = [("vllm-openai", f) for f in FORMATS] + ([("zen", "w8a8")] if cpu.zentorch_active() else [])


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, str]:
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")
    logs = tmp_path_factory.mktemp("quant-builds")
    targets = sorted({t for t, _ in CASES})
    return {t: engine.build(t, logs / f"{t}.log")[0] for t in targets}  # cache hits


def servable_here(fmt: str) -> bool:
    q = read_model(ensure_quant_model(fmt=fmt)).quantization
    return q is not None and set(q.needs_flags) <= cpu.this_host().flags


@pytest.mark.parametrize(("target", "fmt"), CASES)
def test_each_format_serves_exact_tokens_or_is_refused_with_the_way_out(images, target, fmt):
    model = ensure_quant_model(fmt=fmt)
    label = read_model(model).quantization.label
    port = engine.free_port()
    with engine.serve(images[target], model, port, run_opts=("--health-interval=5s",)) as name:
        if not servable_here(fmt):
            engine.wait_for(lambda: not engine.running(name), 60, "the launcher's refusal")
            log = engine.logs(name)
            assert f"{label} needs avx512f" in log and "W8A8 INT8 copy" in log, log
            return
        start = time.monotonic()
        engine.wait_for(lambda: healthy(port), 420, "/health", name, every=2)
        print(f"{target} {fmt}: ready in {time.monotonic() - start:.0f} s")
        log = engine.logs(name)
        assert f"zenvllm-launch: plan: weights: {label};" in log
        body = {
            "model": "/model",
            "prompt": "the quick brown fox",
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
        }
        reply = engine.http_json(f"http://127.0.0.1:{port}/v1/completions", body, timeout=120)
        assert reply["usage"]["completion_tokens"] == MAX_TOKENS, engine.logs(name)
        assert reply["choices"][0]["finish_reason"] == "length"
        assert engine.wait_for(
            lambda: (
                engine.docker(
                    "inspect", "--format", "{{.State.Health.Status}}", name
                ).stdout.strip()
                == "healthy"
            ),
            90,
            "docker's health status",
            name,
        )


def test_int4_on_an_avx2_only_cpu_is_refused_before_vllm_starts(images, tmp_path):
    view = tmp_path / "cpuinfo"
    view.write_text(cpu.fake_cpuinfo("amd-zen3-avx2", len(cpu.this_host().cpus)))
    done = engine.docker(
        *("run", "--rm", "--network", "none", "-v", f"{view}:/proc/cpuinfo:ro"),
        *("-v", f"{ensure_quant_model(fmt='awq')}:/model:ro", images["vllm-openai"]),
        *("--model", "/model"),
        check=False,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "AWQ INT4 (group 128) needs avx512f" in done.stderr
    assert "exec vllm" not in done.stdout + done.stderr
