"""Quality where speed is checked: the trained model (tests/support/trained_model.py),
served by the vllm-openai image in the dtype this CPU computes natively, scores its
held-out text as its float32 reference did, within that dtype's bound (core/quality.py);
and a copy whose one matrix a wrong kernel would double scores beyond it, so the check
can fail.

The text is the maker's held-out token ids (heldout.json), scored by vLLM itself (the
completions API, the prompt echoed with its logprobs: bench/quality.py).
"""

from __future__ import annotations

import array
import json
import shutil
import struct
from pathlib import Path

import pytest
from conftest import require
from support import cpu, engine
from support.trained_model import ensure_trained_model

from zenvllm.bench.quality import served_perplexity
from zenvllm.core import quality
from zenvllm.runtime.health import healthy

pytestmark = pytest.mark.serve

IMAGE = "vllm-openai"
SABOTAGED = "model.layers.0.mlp.down_proj.weight"  # doubled, as a kernel summing twice


def scored(tag: str, model: Path) -> float:
    """Serve `model` (eager: its quality, not its compile, is judged) and score the
    held-out chunks on it."""
    port = engine.free_port()
    chunks = json.loads((model / "heldout.json").read_text())
    with engine.serve(tag, model, port, "--enforce-eager", keep_compiled=False) as name:
        engine.wait_for(
            lambda: healthy(port) or "initialization failed" in engine.logs(name),
            420,
            "/health",
            name,
        )
        assert healthy(port), engine.logs(name)[-3000:]
        return served_perplexity(f"http://127.0.0.1:{port}", "/model", chunks)


def doubled(model: Path, tensor: str, where: Path) -> Path:
    """A copy of `model` whose bf16 `tensor` is doubled (each exponent one higher):
    what a kernel that adds its partial sums twice would compute with it."""
    shutil.copytree(model, where)
    shards = where / "model.safetensors"
    raw = bytearray(shards.read_bytes())
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    assert header[tensor]["dtype"] == "BF16", header[tensor]
    begin, end = (8 + size + offset for offset in header[tensor]["data_offsets"])
    values = array.array("H", raw[begin:end])
    for i, v in enumerate(values):
        if v & 0x7F80 not in (0, 0x7F80):  # normal numbers: exponent + 1 doubles them
            values[i] = v + 0x80
    raw[begin:end] = values.tobytes()
    shards.write_bytes(raw)
    return where


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")
    tag, _ = engine.build(IMAGE, tmp_path_factory.mktemp("logs") / "build.log")
    return tag, ensure_trained_model()


def test_the_trained_model_is_far_from_random_on_text_it_never_saw(trained):
    _, model = trained
    record = json.loads((model / "trained.json").read_text())
    for name, made in record["models"].items():
        ppl = made["perplexity"]
        print(f"{name}: held-out perplexity {ppl['trained']} (untrained {ppl['untrained']})")
        assert ppl["trained"] * 10 <= ppl["untrained"], (name, ppl)


def test_served_in_this_cpus_dtype_it_scores_as_its_float32_reference(trained, tmp_path):
    tag, model = trained
    reference = json.loads((model / "trained.json").read_text())["models"]["main"]
    fmt = cpu.serving_dtype()
    served = quality.judge(fmt, scored(tag, model), reference["perplexity"]["heldout_float32"])
    print(f"served in {fmt}: {served.said()}")
    assert served.within, served.said()
    # The check can fail: the same model with one matrix doubled, served the same way.
    wrong = doubled(model, SABOTAGED, tmp_path / "sabotaged")
    judged = quality.judge(fmt, scored(tag, wrong), served.reference)
    print(f"{SABOTAGED} doubled: {judged.said()}")
    assert not judged.within, judged.said()
