"""The performance model: what a layout of a model serves on a host, predicted from the
host's memory bandwidth and compute. Pure; standard library only.

A decode step of an instance reads its weights once and each sequence's K and V (the
roofline's bytes, bench/roofline.py) over its cores' share of the node's bandwidth, and
computes 2 FLOPs per parameter per sequence at its CPU's decode efficiency
(DECODE_EFFICIENCY; Zen 4's its own) of the rate its cores prefill at; plus OVERHEAD_S
(vLLM's scheduler, sampling, Python). The read and the arithmetic add up: fitted the
same way (below), a roofline's max() of the two missed the 1.5 B shape's runs by up to
34% and batch 1 by up to 95%, the sum holds every run within 18%: at decode's small
batches these CPUs' matmuls do not hide the weight stream behind their arithmetic.
A copy cut in pipeline stages passes them in turn (each reads its part on its cores);
tensor ranks on one host count as one instance over all their cores.

A prompt costs 2 FLOPs per parameter per token at the prefill rate. vLLM's scheduler
mixes prompts into the batch's decode steps (chunked prefill), so under load a request
waits one step for its first token and its tokens wait for the other requests' prompts:
TTFT = prefill + step, TPOT = step + (batch - 1) x prefill / output tokens. Clients in a
closed loop (a concurrency, spread evenly over the instances) each take TTFT + output x
TPOT per request; requests arriving at a rate keep rate x that many in flight (Little).

The constants were fitted (least squares of the log error: output tok/s weight 1, the
bench's TPOT and TTFT and the batch-1 ones 0.3 each) on every vLLM configuration of the
recorded runs of the 0.5 B and 1.5 B shapes under docs/bench (qwen0.5b, qwen1.5b,
qwen0.5b-quant, qwen0.5b-quant-layouts, qwen0.5b-zen, qwen0.5b-zen-algo2, qwen0.5b-split),
then rounded: 11.2 ms, 0.50, 1000 / 708 / 281 GFLOP/s (Zen 4's decode efficiency since
refitted to 0.6 on its later runs, ZEN4 below), INT4 1.84 (taken as 2); AVX2's two rates
on a real Zen 3's runs alone, the others held (qwen0.5b-zen3, qwen0.5b-zen3-emulated-bf16,
2026-12-07; stock there made what one OpenMP core predicts). With the rounded ones every
prediction is within ERROR_BOUND of the measured output tok/s (tests/unit/test_performance.py
prints the table); fitted without the 1.5 B run they predict it within 17%. Not described,
so not fitted: llama.cpp's engine, and the AVX2 view's runs (docs/bench/avx2-view: a
Xeon's cores on the AVX2 path, not a CPU an operator has). Every run is 2 cores of one
node: nothing here has measured a step over tens of cores, a second node or a network hop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zenvllm.core import gate
from zenvllm.core.dtype import NATIVE_BF16_FLAGS
from zenvllm.core.errors import UserError
from zenvllm.core.model import DTYPE_BYTES, Model

OVERHEAD_S = 0.011  # per decode step (and per stage of a pipeline)
DECODE_EFFICIENCY = 0.5  # decode's FLOP rate over prefill's: small batches, thin matmuls
# vLLM's CPU INT4 kernel (AWQ, GPTQ) unpacks each 4-bit weight before multiplying: its
# arithmetic costs this many times bf16's per weight.
INT4_COST = 2.0
# How far from the recorded output tok/s the fitted model stays (predicted / measured - 1).
ERROR_BOUND = 0.18


@dataclass(frozen=True)
class Compute:
    gflops: float  # FLOP/s per core a prompt's prefill reaches, / 1e9
    source: str
    decode_efficiency: float = DECODE_EFFICIENCY  # decode's rate over prefill's


# By what the CPU computes the served dtype with; each fitted as above on its runs.
AMX = Compute(1000.0, "AMX bf16 tiles, fitted on the 2-core Xeon's runs (docs/bench/qwen0.5b*)")
ZEN5 = Compute(700.0, "Zen 5's AVX-512 BF16, fitted on docs/bench/qwen0.5b-zen*")
# Zen 4's decode refitted 2026-12-04: at 0.5 of 280 every Zen 4 run made more than
# predicted (qwen0.5b-predicted 1.097x and 1.071x, and a new Zen 4's bench tier run
# 1.232x, beyond the bound), while its prompts (TTFT) were predicted within 16%; decode at
# 0.6 leaves prefill as fitted (docs/test-runs/2026-12-04-zen4-model-refit.txt).
ZEN4 = Compute(
    280.0,
    "AVX-512 BF16 at Zen 4's rate (256-bit halves), fitted on docs/bench/qwen0.5b-split; "
    "its decode on qwen0.5b-predicted and a bench tier run",
    decode_efficiency=0.6,
)
# A real Zen 3's AVX2 (2026-12-07): the AVX2 view's Xeon cores, on which float32 was first
# fitted (58 GFLOP/s), made a third less than a real Zen 3 does (the plan 46.6 output tok/s
# against 31.6 predicted: docs/test-runs/2026-12-07-zen3-fresh-machine-64120a6.txt).
FLOAT32 = Compute(
    90.0,
    "float32 on a Zen 3's AVX2, fitted on docs/bench/qwen0.5b-zen3*",
    decode_efficiency=0.6,
)
# vLLM's bf16 where the CPU has no bf16 instructions: torch's fallback, not oneDNN's kernels.
EMULATED_BF16 = Compute(
    15.0,
    "bf16 emulated on a Zen 3's AVX2, fitted on docs/bench/qwen0.5b-zen3-emulated-bf16",
)


def compute_of(flags: frozenset[str], generation: str, dtype: str) -> Compute:
    """The prefill rate of one core serving `dtype` on a CPU with these flags."""
    if dtype == "float32":
        return FLOAT32
    if not any(f in flags for f in NATIVE_BF16_FLAGS):
        return EMULATED_BF16
    if "amx_bf16" in flags:
        return AMX
    return ZEN5 if generation == "Zen 5" else ZEN4


@dataclass(frozen=True)
class Machine:
    """What a host gives a decode step."""

    core_gbs: float  # GB/s each core reads with every core of its node reading
    compute: Compute
    bandwidth_source: str = ""
    core_alone_gbs: float = 0.0  # one core with its node to itself (0: unknown)
    node_cores: int = 0  # cores sharing a node's bandwidth (0: unknown)

    def stream_gbs(self, cores: int, streaming: int = 0) -> float:
        """GB/s `cores` cores read while `streaming` cores of their node read at once (0:
        all): the every-core-busy share, more when fewer read, never above one core
        alone (the roofline's batch-1 rule)."""
        share = self.core_gbs
        if 0 < streaming < self.node_cores:
            alone = max(self.core_alone_gbs, self.core_gbs)
            share = min(alone, self.core_gbs * self.node_cores / streaming)
        return cores * share


@dataclass(frozen=True)
class Shape:
    """What a step of the model costs."""

    weight_bytes: int  # one copy as served: its dtype, its packed format
    flops_per_token: float  # 2 per parameter (INT4_COST times that for 4-bit weights)
    kv_bytes_per_token: int = 0  # 0: unknown, not counted


def shape_of(model: Model) -> Shape:
    """The model as served (core/dtype.py): its parameters from its floating tensors at
    their dtype's size and its packed ones at the format's bits per weight."""
    floating = model.weight_bytes if model.float_bytes is None else model.float_bytes
    bits = (model.quantization.bits if model.quantization else 0) or 8
    packed = (model.weight_bytes - floating) * 8 / bits
    flops = 2 * (
        floating / DTYPE_BYTES.get(model.dtype, 2) + packed * (INT4_COST if bits == 4 else 1)
    )
    return Shape(model.weight_bytes, flops, model.kv_bytes_per_token or 0)


@dataclass(frozen=True)
class Layout:
    cores: int  # OpenMP cores of an instance (of each stage of a pipeline)
    instances: int = 1
    stages: int = 1  # pipeline stages a step passes in turn
    streaming: int = 0  # cores of the node reading at once (0: every core)


@dataclass(frozen=True)
class Load:
    prompt: int  # tokens in
    output: int  # tokens out
    concurrency: int = 0  # clients in a closed loop; 0 when a rate is given
    rate: float = 0.0  # requests per second

    @property
    def text(self) -> str:
        first = f"concurrency={self.concurrency}" if self.concurrency else f"rate={self.rate:g}"
        return f"{first},in={self.prompt},out={self.output}"


@dataclass(frozen=True)
class Slo:
    tpot_ms: float = 0.0  # 0: no target
    ttft_ms: float = 0.0
    user_tok_s: float = 0.0  # tokens per second each user reads: 1000 / TPOT

    @property
    def text(self) -> str:
        named = (("tpot_ms", self.tpot_ms), ("ttft_ms", self.ttft_ms))
        return ",".join(f"{k}={v:g}" for k, v in (*named, ("user_tok_s", self.user_tok_s)) if v)


@dataclass(frozen=True)
class Prediction:
    batch: float  # sequences in flight per instance
    step_ms: float  # one decode step at that batch (the bench's TPOT: its clients start together)
    tpot_ms: float  # the other requests' prompts included
    ttft_ms: float
    output_tok_s: float  # every instance together


def step_s(shape: Shape, machine: Machine, layout: Layout, batch: float, context: float) -> float:
    """One decode step of `batch` sequences of `context` tokens each."""
    read = shape.weight_bytes + batch * context * shape.kv_bytes_per_token
    rate = layout.cores * machine.compute.gflops * 1e9 * machine.compute.decode_efficiency
    stream = machine.stream_gbs(layout.cores, layout.streaming) * 1e9
    return read / stream + shape.flops_per_token * batch / rate + OVERHEAD_S * layout.stages


def prefill_s(shape: Shape, machine: Machine, layout: Layout, tokens: int) -> float:
    """A prompt's arithmetic (its step's read and overhead are the batch's)."""
    return shape.flops_per_token * tokens / (layout.cores * machine.compute.gflops * 1e9)


def predict(shape: Shape, machine: Machine, layout: Layout, load: Load, batch: float) -> Prediction:
    """Every instance at `batch` sequences of the load's requests."""
    step = step_s(shape, machine, layout, batch, load.prompt + load.output / 2)
    prefill = prefill_s(shape, machine, layout, load.prompt)
    tpot = step + max(batch - 1, 0) * prefill / load.output  # the other clients' prompts
    ttft = prefill + step
    per_request = ttft + load.output * tpot
    tok_s = layout.instances * batch * load.output / per_request
    return Prediction(batch, 1000 * step, 1000 * tpot, 1000 * ttft, tok_s)


def batch_of(shape: Shape, machine: Machine, layout: Layout, load: Load) -> float:
    """Sequences in flight per instance: the clients spread evenly, or for a rate what
    Little's law keeps (inf: more than the instances can serve at any batch)."""
    if load.concurrency:
        return load.concurrency / layout.instances
    rate = load.rate / layout.instances
    context = load.prompt + load.output / 2
    first = step_s(shape, machine, layout, 0, context)
    per_seq = step_s(shape, machine, layout, 1, context) - first
    prefill = prefill_s(shape, machine, layout, load.prompt)
    # A request takes batch x prefill + (output + 1) x step(batch), step linear in batch.
    room = 1 - rate * (prefill + (load.output + 1) * per_seq)
    return rate * (load.output + 1) * first / room if room > 0 else math.inf


# -- the load and the target, as --load and --slo give them


LOAD_EXAMPLE = "concurrency=200,in=1000,out=300"
SLO_EXAMPLE = "tpot_ms=250,ttft_ms=2000"
MAX_CLIENTS = 1_000_000
MAX_TOKENS = 1 << 24  # --max-model-len's limit
MAX_MS = 3_600_000.0  # an hour


def whole_field(given: dict[str, str], key: str, high: int, example: str) -> int:
    return gate.whole_text(given[key], key, 1, high, f"e.g. {example}")


def real_field(given: dict[str, str], key: str, high: float, example: str) -> float:
    return gate.number_text(given[key], key, 0, high, f"e.g. {example}")


def parse_load(text: str) -> Load:
    """`concurrency=N,in=P,out=O` or `rate=R,in=P,out=O`, refused by value."""
    ex = LOAD_EXAMPLE
    given = gate.fields(text, ("concurrency", "rate", "in", "out"), f"e.g. {ex}")
    lacking = [f"{k}=" for k in ("in", "out") if k not in given]
    if "concurrency" not in given and "rate" not in given:
        lacking.append("concurrency= (clients) or rate= (requests/s)")
    if lacking or ("concurrency" in given and "rate" in given):
        what = f"lacks {lacking[0]}" if lacking else "gives both concurrency= and rate="
        raise UserError(f"{text[:80]!r} {what}; e.g. {ex} or rate=5,in=1000,out=300")
    clients = whole_field(given, "concurrency", MAX_CLIENTS, ex) if "concurrency" in given else 0
    return Load(
        prompt=whole_field(given, "in", MAX_TOKENS, ex),
        output=whole_field(given, "out", MAX_TOKENS, ex),
        concurrency=clients,
        rate=real_field(given, "rate", MAX_CLIENTS, ex) if "rate" in given else 0.0,
    )


def parse_slo(text: str) -> Slo:
    """`tpot_ms=X[,ttft_ms=Y][,user_tok_s=Z]`, at least one, refused by value."""
    ex = SLO_EXAMPLE
    given = gate.fields(text, ("tpot_ms", "ttft_ms", "user_tok_s"), f"e.g. {ex}")
    return Slo(
        tpot_ms=real_field(given, "tpot_ms", MAX_MS, ex) if "tpot_ms" in given else 0.0,
        ttft_ms=real_field(given, "ttft_ms", MAX_MS, ex) if "ttft_ms" in given else 0.0,
        user_tok_s=real_field(given, "user_tok_s", 1e6, ex) if "user_tok_s" in given else 0.0,
    )
