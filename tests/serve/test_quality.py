"""Quality where speed is checked: the trained model (tests/support/trained_model.py),
served by the vllm-openai image in the dtype this CPU computes natively, scores its
held-out text as its float32 reference did, within that dtype's bound (core/quality.py);
and a copy whose one matrix a wrong kernel would double scores beyond it, so the check
can fail. Served with the n-gram speculation a plan gives for `speculation: ngram`
(core/speculation.py), it answers greedily token for token as without it, and drafts.

The text is the maker's held-out token ids (heldout.json), scored by vLLM itself (the
completions API, the prompt echoed with its logprobs: bench/quality.py).
"""

from __future__ import annotations

import array
import contextlib
import json
import shutil
import struct
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require
from support import cpu, engine
from support.trained_model import ensure_trained_model

from zenvllm.bench import quality as bench_quality
from zenvllm.bench.quality import served_perplexity
from zenvllm.core import quality, speculation
from zenvllm.runtime.health import healthy

pytestmark = pytest.mark.serve

IMAGE = "vllm-openai"
SABOTAGED = "model.layers.0.mlp.down_proj.weight"  # doubled, as a kernel summing twice


@contextlib.contextmanager
def served(tag: str, model: Path, *extra: str) -> Iterator[str]:
    """`model` served (eager: its answers, not its compile, are judged); its URL."""
    port = engine.free_port()
    with engine.serve(tag, model, port, "--enforce-eager", *extra, keep_compiled=False) as name:
        engine.wait_for(
            lambda: healthy(port) or "initialization failed" in engine.logs(name),
            420,
            "/health",
            name,
        )
        assert healthy(port), engine.logs(name)[-3000:]
        yield f"http://127.0.0.1:{port}"


def scored(url: str, model: Path) -> float:
    """The held-out chunks' perplexity as the server at `url` scores them."""
    return served_perplexity(url, "/model", json.loads((model / "heldout.json").read_text()))


def greedy(url: str, model: Path) -> list[list[int]]:
    """The bench's greedy token ids (bench/quality.py) after each of 4 prompts: 2 whose
    answer can copy from them (a held-out chunk, then its first 32 ids again) and 2
    whose answer cannot."""
    chunks = json.loads((model / "heldout.json").read_text())
    prompts = [c + c[:32] for c in chunks[:2]] + [c[:96] for c in chunks[2:4]]
    return [bench_quality.greedy(url, "/model", ids) for ids in prompts]


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as reply:
        lines = reply.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name))


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


@pytest.fixture(scope="module")
def plain(trained):
    """The trained model served once, as the image serves it on this CPU: its URL."""
    tag, model = trained
    with served(tag, model) as url:
        yield url


def test_the_trained_model_is_far_from_random_on_text_it_never_saw(trained):
    _, model = trained
    record = json.loads((model / "trained.json").read_text())
    for name, made in record["models"].items():
        ppl = made["perplexity"]
        print(f"{name}: held-out perplexity {ppl['trained']} (untrained {ppl['untrained']})")
        assert ppl["trained"] * 10 <= ppl["untrained"], (name, ppl)


def test_served_in_this_cpus_dtype_it_scores_as_its_float32_reference(trained, plain, tmp_path):
    tag, model = trained
    reference = json.loads((model / "trained.json").read_text())["models"]["main"]
    fmt = cpu.serving_dtype()
    judged = quality.judge(fmt, scored(plain, model), reference["perplexity"]["heldout_float32"])
    print(f"served in {fmt}: {judged.said()}")
    assert judged.within, judged.said()
    # The check can fail: the same model with one matrix doubled, served the same way.
    wrong = doubled(model, SABOTAGED, tmp_path / "sabotaged")
    with served(tag, wrong) as url:
        sabotaged = quality.judge(fmt, scored(url, wrong), judged.reference)
    print(f"{SABOTAGED} doubled: {sabotaged.said()}")
    assert not sabotaged.within, sabotaged.said()


def test_with_ngram_speculation_it_answers_as_without_and_drafts(trained, plain):
    """The flag a plan gives for `speculation: ngram`; the drafts it accepted, counted by
    vLLM, show that speculation ran (equal answers alone would hold without it)."""
    tag, model = trained
    args = speculation.decide("ngram", "generate", split=False).serve_args()
    without = greedy(plain, model)
    with served(tag, model, *args) as url:
        spoken = greedy(url, model)
        accepted = metric(url, "vllm:spec_decode_num_accepted_tokens_total")
    print(f"n-gram speculation: {accepted:.0f} drafted tokens accepted over 4 answers")
    assert spoken == without
    assert accepted > 0
