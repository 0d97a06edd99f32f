"""The performance model (core/performance.py) against every recorded bench run of the
0.5 B and 1.5 B shapes: each configuration it describes is predicted from the run's own
bandwidth figures, its machine's compute and its workload, and held to the measured
output tokens/s within the model's bound; a model with the bandwidth doubled is not."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from support.tiny_model import SHAPES

from zenvllm.bench.layouts import cpu_ids
from zenvllm.core import performance
from zenvllm.core.errors import UserError
from zenvllm.core.performance import Layout, Load, Machine, Shape

BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"
# Each run's machine as docs/benchmarks.md's table names it: its CPU flags and generation.
XEON_AMX = (frozenset({"avx512_bf16", "amx_bf16"}), "Sapphire Rapids")
ZEN5 = (frozenset({"avx512_bf16"}), "Zen 5")
ZEN4 = (frozenset({"avx512_bf16"}), "Zen 4")
AVX2_VIEW = (frozenset({"avx2"}), "Zen 3")  # a Xeon's cores held to AVX2 kernels
RUNS = {
    "qwen0.5b": XEON_AMX,
    "qwen1.5b": XEON_AMX,
    "qwen0.5b-quant": XEON_AMX,
    "qwen0.5b-quant-layouts": XEON_AMX,
    "qwen0.5b-zen": ZEN5,
    "qwen0.5b-zen-algo2": ZEN5,
    "qwen0.5b-split": ZEN4,
    "qwen0.5b-avx2-view": AVX2_VIEW,
    "qwen0.5b-avx2-view-2": AVX2_VIEW,
}
# What the model does not describe, and why (the report names each).
LLAMACPP = "llama.cpp's own engine and scheduler, not vLLM's"
AVX2_STOCK = (
    "stock under the AVX2 view made the 2-core plan's tokens/s (30.9 against 31.1); the "
    "model counts the one core vLLM's binding gives OpenMP, and why both cores count on "
    "that path is not established"
)


def not_described(run: str, name: str) -> str:
    if name.startswith("llamacpp"):
        return LLAMACPP
    if run.startswith("qwen0.5b-avx2-view") and name == "stock":
        return AVX2_STOCK
    return ""


def shape_of(meta: dict, server: dict, dtype: str) -> Shape:
    """The run's model as served: its parameters (bf16 as stored) and KV from the bench
    shape, the copy's own bytes (a quantized copy's), doubled in float32."""
    tiny = next(s for s in SHAPES.values() if s.name == meta["model"])
    scale = 2 if dtype == "float32" else 1
    weights = (server.get("weight_bytes") or meta["weight_bytes"]) * scale
    kv = tiny.layers * tiny.kv_dim * 2 * 2 * scale
    int4 = performance.INT4_COST if "awq" in server.get("model_dir", "") else 1
    return Shape(weights, meta["weight_bytes"] * int4, kv)  # 2 FLOPs per 2-byte weight


def layout_of(config: dict, host_cores: int) -> Layout:
    """Instances and OpenMP cores, as the bench started them: stock's auto binding keeps
    one core of each rank for vLLM's API server; tensor ranks are one instance over all
    their cores; pipeline stages take turns."""
    ranks = [r for s in config["servers"] for r in s["omp_bind"].split("|")]
    if ranks == ["auto"]:
        return Layout(host_cores - 1, streaming=host_cores - 1)
    cores = [len(cpu_ids(r)) for r in ranks]
    if config["kind"] == "tp":
        return Layout(sum(cores), streaming=sum(cores))
    if config["kind"] == "pp":
        return Layout(cores[0], stages=len(cores), streaming=cores[0])
    return Layout(cores[0], len(cores), streaming=sum(cores))


def machine_of(meta: dict, flags: frozenset[str], generation: str, dtype: str) -> Machine:
    return Machine(
        meta["core_bandwidth_gbs"],
        performance.compute_of(flags, generation, dtype),
        meta.get("bandwidth_source") or "",
        meta.get("core_alone_gbs") or 0.0,
        meta.get("node_cores") or meta["host_cores"],
    )


def recorded(gbs_scale: float = 1.0) -> list[dict]:
    """Every configuration of the recorded runs: predicted and measured, or why not."""
    rows = []
    for run, (flags, generation) in RUNS.items():
        doc = json.loads((BENCH / run / "results.json").read_text())
        meta, work = doc["meta"], doc["meta"]["workload"]
        meta = {**meta, "core_bandwidth_gbs": meta["core_bandwidth_gbs"] * gbs_scale}
        meta["core_alone_gbs"] = (meta.get("core_alone_gbs") or 0.0) * gbs_scale
        load = Load(work["input_len"], work["output_len"], concurrency=work["concurrency"])
        configs = {c["name"]: c for c in doc["configurations"]}
        for s in doc["summary"]:
            config = configs[s["config"]]
            row = {"run": run, "config": s["config"], "measured": s["output_tok_s"]}
            why = not_described(run, s["config"])
            if why:
                rows.append({**row, "why": why})
                continue
            stock = config["kind"] == "stock"
            dtype = meta.get("stock_dtype" if stock else "plan_dtype") or "bfloat16"
            shape = shape_of(meta, config["servers"][0], dtype)
            machine = machine_of(meta, flags, generation, dtype)
            layout = layout_of(config, meta["host_cores"])
            at = performance.predict(
                shape, machine, layout, load, load.concurrency / layout.instances
            )
            alone = replace(layout, streaming=layout.cores)
            one = performance.predict(shape, machine, alone, load, 1)
            rows.append(
                {
                    **row,
                    "predicted": at.output_tok_s,
                    "error": at.output_tok_s / s["output_tok_s"] - 1,
                    "step_ms": (at.step_ms, s["tpot_ms"]),
                    "wave_ttft_ms": (at.ttft_ms, s["ttft_ms"]),
                    "batch1_tpot_ms": (one.tpot_ms, s.get("batch1_tpot_ms")),
                    "batch1_ttft_ms": (one.ttft_ms, s.get("batch1_ttft_ms")),
                }
            )
    return rows


def check(rows: list[dict], bound: float = performance.ERROR_BOUND) -> list[str]:
    """The configurations the model misses by more than `bound`."""
    return [
        f"{r['run']} {r['config']}: predicted {r['predicted']:.1f}, measured {r['measured']}"
        for r in rows
        if "why" not in r and abs(r["error"]) > bound
    ]


def table(rows: list[dict]) -> str:
    def pair(value: tuple[float, float | None]) -> str:
        return f"{value[0]:.0f} / {value[1]:.0f}" if value[1] else f"{value[0]:.0f} / -"

    lines = [
        "| run | configuration | output tok/s predicted / measured | error | step ms "
        "| batch-1 TPOT ms | batch-1 TTFT ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "why" in r:
            why = f"not described: {r['why']}"
            lines.append(f"| {r['run']} | {r['config']} | - / {r['measured']} | {why} | | | |")
            continue
        lines.append(
            f"| {r['run']} | {r['config']} | {r['predicted']:.1f} / {r['measured']} "
            f"| {100 * r['error']:+.1f}% | {pair(r['step_ms'])} | {pair(r['batch1_tpot_ms'])} "
            f"| {pair(r['batch1_ttft_ms'])} |"
        )
    return "\n".join(lines)


def test_every_recorded_configuration_is_predicted_within_the_bound():
    rows = recorded()
    print(table(rows))  # pytest -s shows it
    described = [r for r in rows if "why" not in r]
    assert len(described) == 31
    assert check(rows) == []
    worst = max(abs(r["error"]) for r in described)
    assert worst > performance.ERROR_BOUND - 0.02  # the bound is the one achieved, not a loose one
    # What it does not describe, each with its reason: llama.cpp, and the AVX2 view's stock.
    skipped = sorted(r["config"] for r in rows if "why" in r)
    assert skipped == ["llamacpp"] * 2 + ["llamacpp-q8"] * 2 + ["stock"] * 2


def test_a_model_with_the_bandwidth_doubled_fails_the_check():
    rows = recorded(gbs_scale=2.0)
    missed = check(rows)
    assert len(missed) > len([r for r in rows if "why" not in r]) / 2, "\n".join(missed)


# -- the model's arithmetic

ZEN4_2CORE = Machine(14.03, performance.ZEN4, "test", core_alone_gbs=18.71, node_cores=2)
HALF_B = Shape(988_010_240, 988_010_240, 12_288)  # the 0.5 B shape in bf16: 2 FLOPs a weight


def test_a_step_reads_the_weights_and_kv_then_computes_then_pays_its_overhead():
    layout = Layout(cores=2)
    step = performance.step_s(HALF_B, ZEN4_2CORE, layout, 16, 192)
    read = (988_010_240 + 16 * 192 * 12_288) / (2 * 14.03e9)
    compute = 16 * 988_010_240 / (2 * 280e9 * performance.DECODE_EFFICIENCY)
    assert step == pytest.approx(read + compute + performance.OVERHEAD_S)
    # Pipeline stages pass in turn: the same reads and arithmetic, an overhead per stage.
    staged = performance.step_s(HALF_B, ZEN4_2CORE, Layout(cores=2, stages=2), 16, 192)
    assert staged - step == pytest.approx(performance.OVERHEAD_S)


def test_fewer_cores_reading_get_more_each_but_never_more_than_one_alone():
    assert ZEN4_2CORE.stream_gbs(2) == pytest.approx(28.06)  # every core busy
    assert ZEN4_2CORE.stream_gbs(1, streaming=1) == pytest.approx(18.71)  # alone: its own figure
    spec_sheet = Machine(4.0, performance.ZEN4)  # no node figures: the busy share
    assert spec_sheet.stream_gbs(23, streaming=1) == pytest.approx(92.0)


def test_load_and_latency_agree_with_littles_law():
    layout, load = Layout(cores=2), Load(128, 128, rate=0.5)
    batch = performance.batch_of(HALF_B, ZEN4_2CORE, layout, load)
    at = performance.predict(HALF_B, ZEN4_2CORE, layout, load, batch)
    latency = (at.ttft_ms + load.output * at.tpot_ms) / 1000
    assert batch == pytest.approx(load.rate * latency)
    assert at.output_tok_s == pytest.approx(load.rate * load.output)
    # More than the instance serves at any batch: no steady state.
    assert performance.batch_of(HALF_B, ZEN4_2CORE, layout, Load(128, 128, rate=50)) == float("inf")


def test_each_requests_tokens_wait_for_the_other_prompts():
    layout, load = Layout(cores=2), Load(128, 128, concurrency=16)
    alone, busy = (performance.predict(HALF_B, ZEN4_2CORE, layout, load, b) for b in (1, 16))
    assert alone.tpot_ms == pytest.approx(alone.step_ms)  # no other prompt to wait for
    prefill = performance.prefill_s(HALF_B, ZEN4_2CORE, layout, 128) * 1000
    assert busy.tpot_ms == pytest.approx(busy.step_ms + 15 * prefill / 128)


def test_compute_by_what_the_cpu_computes_the_dtype_with():
    bf16 = frozenset({"avx512f", "avx512_bf16"})
    assert (
        performance.compute_of(bf16 | {"amx_bf16"}, "Sapphire Rapids", "bfloat16")
        == performance.AMX
    )
    assert performance.compute_of(bf16, "Zen 5", "bfloat16") == performance.ZEN5
    assert performance.compute_of(bf16, "Zen 4", "bfloat16") == performance.ZEN4
    assert performance.compute_of(bf16, "Zen 4", "float32") == performance.FLOAT32
    emulated = performance.compute_of(frozenset({"avx2"}), "Zen 3", "bfloat16")
    assert emulated.gflops < performance.FLOAT32.gflops and "emulated" in emulated.source


def test_a_quantized_model_computes_per_weight_not_per_byte():
    from zenvllm.core.model import Model
    from zenvllm.core.quantization import Quantization

    int4 = Quantization("awq", "AWQ INT4 (group 128)", bits=4)
    awq = Model("awq", weight_bytes=458_259_200, float_bytes=272_000_000, quantization=int4)
    shape = performance.shape_of(awq)
    floating, packed = 272_000_000 / 2, (458_259_200 - 272_000_000) * 2  # 2 weights a byte
    assert shape.flops_per_token == pytest.approx(2 * (floating + packed * performance.INT4_COST))
    assert performance.shape_of(Model("bf16", weight_bytes=1000)).flops_per_token == 1000


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "concurrency=-1,in=1,out=1",
            "concurrency is '-1', not a whole number from 1 to 1,000,000",
        ),
        ("foo=1", "'foo=1' is not one of concurrency=, rate=, in=, out="),
        ("concurrency=4", "lacks in="),
        ("in=10,out=10", "lacks concurrency= (clients) or rate= (requests/s)"),
        ("rate=1,concurrency=2,in=1,out=1", "gives both concurrency= and rate="),
        ("rate=inf,in=1,out=1", "rate is 'inf', not a number in (0, 1,000,000]"),
        ("concurrency=2,in=1,out=1,out=2", "gives out twice"),
    ],
)
def test_a_bad_load_is_refused_by_value_with_an_example(text, says):
    with pytest.raises(UserError) as refused:
        performance.parse_load(text)
    assert says in str(refused.value) and "e.g. concurrency=200,in=1000,out=300" in str(
        refused.value
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tpot_ms=abc", "tpot_ms is 'abc', not a number in (0, 3,600,000]"),
        ("tpot_ms=0", "tpot_ms is '0', not a number in (0"),
        ("p99=5", "'p99=5' is not one of tpot_ms=, ttft_ms=, user_tok_s="),
    ],
)
def test_a_bad_slo_is_refused_by_value_with_an_example(text, says):
    with pytest.raises(UserError) as refused:
        performance.parse_slo(text)
    assert says in str(refused.value) and "e.g. tpot_ms=250" in str(refused.value)


def test_a_load_and_slo_read_back_as_written():
    load = performance.parse_load("concurrency=200,in=1000,out=300")
    assert (
        load == Load(1000, 300, concurrency=200) and load.text == "concurrency=200,in=1000,out=300"
    )
    assert performance.parse_load("rate=2.5,in=10,out=20").text == "rate=2.5,in=10,out=20"
    slo = performance.parse_slo("user_tok_s=10,tpot_ms=250")
    assert (
        slo == performance.Slo(tpot_ms=250, user_tok_s=10)
        and slo.text == "tpot_ms=250,user_tok_s=10"
    )
