"""The dtype vLLM serves in: the one this CPU computes natively, unless the operator says.

vLLM 0.32's CPU linears run bf16 through oneDNN only where the CPU has AVX512-BF16 (or
AMX-BF16); elsewhere it logs "Failed to create oneDNN linear, fallback to torch linear"
and plain torch emulates bf16. Measured on an AMD EPYC Zen 3 (AVX2, KVM, 2 cores): the
0.5 B shape served 11.6 output tok/s in bfloat16 against 50.5 in float32 on the same
layout (4.35x; `vllm bench serve`, 128 in / 128 out, concurrency 16). So the planner
serves half-precision weights as bfloat16 where the silicon has it and as float32
everywhere else, and sizes the weights and the KV cache in the dtype served: float32
doubles both. Quantized formats keep their packed integers; their floating tensors
(scales, embeddings, norms) follow the same rule. Pure; standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zenvllm.core.host import Host
from zenvllm.core.model import DTYPE_BYTES, Model

# /proc/cpuinfo flags whose presence means bf16 matmuls run in hardware.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# How much slower vLLM serves emulated bf16 than float32 where the CPU lacks them: float32's
# output tok/s over bf16's for the planner's layout on a real 2-core Zen 3 (46.6 against
# 10.3: docs/bench/qwen0.5b-zen3 and qwen0.5b-zen3-emulated-bf16; 4.44x within one run,
# docs/test-runs/2026-12-07-zen3-fresh-machine-64120a6.txt). The AVX2 view's Xeon cores
# made 1.47x (docs/bench/avx2-path): the view takes the path, not a Zen 3's timing.
EMULATED_BF16_SLOWDOWN = 4.4
EMULATED_BF16_SOURCE = "measured on a real Zen 3, docs/bench/qwen0.5b-zen3*"
AUTO = "auto"
# What an operator may force (vLLM's names); auto lets the planner decide.
CHOICES = (AUTO, "bfloat16", "float32", "float16")


@dataclass(frozen=True)
class Served:
    dtype: str
    why: str


def native_bf16(host: Host) -> bool:
    return any(flag in host.flags for flag in NATIVE_BF16_FLAGS)


def serving_dtype(host: Host, asked: str = AUTO) -> Served:
    """The dtype to serve in on `host`, and why (for the plan's notes)."""
    if asked != AUTO:
        return Served(asked, f"dtype {asked}: asked for by the operator")
    cpu = host.cpu_name
    if native_bf16(host):
        flags = " and ".join(f for f in NATIVE_BF16_FLAGS if f in host.flags)
        return Served("bfloat16", f"dtype bfloat16: {cpu} computes it natively ({flags})")
    return Served(
        "float32",
        f"dtype float32: {cpu} has neither {' nor '.join(NATIVE_BF16_FLAGS)}, so vLLM would "
        f"emulate bf16 ({EMULATED_BF16_SLOWDOWN:g}x slower than float32, "
        f"{EMULATED_BF16_SOURCE}); weights and KV cache are counted at 4 bytes",
    )


def served_model(model: Model, dtype: str) -> Model:
    """The model as vLLM holds it in `dtype`: floating weights and KV bytes rescaled."""
    stored, served = DTYPE_BYTES.get(model.dtype, 2), DTYPE_BYTES.get(dtype, 2)
    if stored == served:
        return replace(model, dtype=dtype)
    floating = model.weight_bytes if model.float_bytes is None else model.float_bytes
    kv = model.kv_bytes_per_token
    return replace(
        model,
        dtype=dtype,
        weight_bytes=model.weight_bytes + floating * served // stored - floating,
        float_bytes=floating * served // stored,
        kv_bytes_per_token=kv * served // stored if kv else kv,
    )


def doubled(model: Model, host: Host, asked: str = AUTO) -> bool:
    """Whether the planner's own choice of float32 doubles this model's half-precision
    weights on this host (the case where bfloat16 is the way out of a refusal)."""
    chosen = serving_dtype(host, asked).dtype
    return asked == AUTO and chosen == "float32" and DTYPE_BYTES.get(model.dtype, 2) == 2
