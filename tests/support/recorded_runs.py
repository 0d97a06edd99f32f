"""The recorded bench runs of the 0.5 B and 1.5 B shapes under docs/bench, with what the
performance model needs of them that they predate: each run's machine as
docs/benchmarks.md's table names it (its CPU flags and generation), and its model's
FLOPs and KV bytes per token, which the bench records in meta since
(bench/predicted.py's meta_of)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.tiny_model import SHAPES

from zenvllm.core import performance

BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"
XEON_AMX = (("amx_bf16", "avx512_bf16", "avx512f"), "Sapphire Rapids")
ZEN5 = (("avx512_bf16", "avx512f"), "Zen 5")
ZEN4 = (("avx512_bf16", "avx512f"), "Zen 4")
ZEN3 = (("avx2",), "Zen 3")
RUNS = {
    "qwen0.5b": XEON_AMX,
    "qwen1.5b": XEON_AMX,
    "qwen0.5b-quant": XEON_AMX,
    "qwen0.5b-quant-layouts": XEON_AMX,
    "qwen0.5b-zen": ZEN5,
    "qwen0.5b-zen-algo2": ZEN5,
    "qwen0.5b-split": ZEN4,
    "qwen0.5b-zen3": ZEN3,
    "qwen0.5b-zen3-emulated-bf16": ZEN3,
}


def facts(run: str, doc: dict[str, Any]) -> dict[str, Any]:
    """The meta fields the bench records now, for a run recorded before: the bf16 model's
    2 FLOPs per 2-byte weight, an AWQ copy's times INT4_COST (as the model was fitted)."""
    flags, generation = RUNS[run]
    meta = doc["meta"]
    shape = next(s for s in SHAPES.values() if s.name == meta["model"])
    copies = {s.get("model_dir") for c in doc["configurations"] for s in c["servers"]} - {"", None}
    flops = {"": meta["weight_bytes"]}
    for path in copies:
        flops[path] = meta["weight_bytes"] * (performance.INT4_COST if "awq" in path else 1)
    return {
        "cpu_flags": list(flags),
        "cpu_generation": generation,
        "model_dtype": "bfloat16",
        "kv_bytes_per_token": shape.layers * shape.kv_dim * 2 * 2,  # K and V, 2 bytes each
        "flops_per_token": flops,
    }


def recorded(run: str) -> dict[str, Any]:
    """A recorded run's document, its meta completed with `facts`."""
    doc = json.loads((BENCH / run / "results.json").read_text())
    doc["meta"] |= facts(run, doc)
    return doc
