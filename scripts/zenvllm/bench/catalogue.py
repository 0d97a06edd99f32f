"""The benchmark's catalogue: every configuration `zenvllm bench --configs` can name for
each model kind (a generating model's; a pooling model's), before it meets a host
(bench/layouts.py resolves each on the host), and the goals a run is checked against.
Pure data."""

from __future__ import annotations

from dataclasses import dataclass

# vLLM's CPU guide, "How to decide VLLM_CPU_KVCACHE_SPACE?": "This value is 4GB by default".
STOCK_KV_GIB = 4
# vLLM's CPU guide's `docker run` example.
STOCK_SHM = "4g"
# As a user runs a bf16 model; `zenvllm bench --stock-dtype plan` gives stock the plan's.
STOCK_DTYPE = "bfloat16"
STOCK = "stock"
PLANNER = "auto"  # the configuration that is the planner's own choice
# The quality reference of a generating model: stock vLLM in float32, one copy unsplit,
# scored only (no throughput runs); every other configuration's quality is judged
# against it (core/quality.py, bench/scored.py). Where stock serves float32 it is stock.
REFERENCE = "reference-f32"
REFERENCE_KIND = "reference"
INFINITY = "infinity"  # a pooling model's peer: infinity-emb's server
ACCEPTANCE_RATIO = 1.3  # the goal: the planner's layout >= 1.3x stock output throughput
NEAR_BEST = 0.95  # the goal: the planner's layout >= 0.95x the best that serves the same weights
# What a user would run instead of zenvllm: vLLM's own parallel sizes as its CPU guide
# runs them (one container over the plan's slices, a rank per slice: data parallel's whole
# copies, or one copy split by tensor or pipeline parallel), and llama.cpp.
PEER_KINDS = ("dp", "tp", "pp", "llamacpp")
RANK_FLAGS = {
    "dp": "--data-parallel-size",
    "tp": "--tensor-parallel-size",
    "pp": "--pipeline-parallel-size",
}
SPLIT_KINDS = ("tp", "pp")  # one copy over every rank
# Bytes a decode step reads per bf16 weight byte: Q8_0 stores 32 weights in 34 bytes.
GGUF_BYTES = {"bf16": 1.0, "q8_0": 34 / 64}


@dataclass(frozen=True)
class Spec:
    """A configuration before it meets the host."""

    name: str
    # stock | plan | dp, tp or pp (vLLM's own parallel over the plan's slices: RANK_FLAGS)
    # | llamacpp | gateway | infinity
    kind: str
    summary: str
    target: str = "vllm-openai"  # the image (a peer's own for llamacpp)
    # plan: None auto, N, "per-node", "two-per-node" or "ranks" (per node; two on one node)
    instances: int | str | None = None
    layout: str = "contiguous"
    gguf: str = ""  # llamacpp: the GGUF type its weights are converted to
    env: tuple[tuple[str, str], ...] = ()  # plan: over each instance's planned env
    dtype: str = ""  # plan: the dtype asked of the planner; "": the one it chooses
    speculation: str = ""  # plan: the speculation asked of the planner; "": its default


CATALOGUE = (
    Spec(STOCK, "stock", "vLLM's docs: one container, all CPUs, default env, auto binding"),
    # The planner's own choice comes first, so layouts identical to it fold into it.
    Spec(PLANNER, "plan", "planner's auto layout (contiguous cores)"),
    Spec("single", "plan", "planner: one instance on all cores", instances=1),
    Spec("per-node", "plan", "planner: one instance per NUMA node", instances="per-node"),
    Spec("two-per-node", "plan", "planner: two instances per NUMA node", instances="two-per-node"),
    Spec(
        "auto-interleaved",
        "plan",
        "planner's auto instance count, interleaved cores",
        layout="interleaved",
    ),
    # The plan without its thread binding (vLLM's default, as stock runs): what the
    # binding alone buys; the speed guard's sabotaged plan (bench/guard.py --config).
    Spec(
        "auto-stock-bind",
        "plan",
        "planner's auto layout with vLLM's default thread binding (auto), as stock has",
        env=(("VLLM_CPU_OMP_THREADS_BIND", "auto"),),
    ),
    # The plan in the model's dtype, as stock serves it, where the planner would choose
    # another (float32 on a CPU that emulates bf16): what the dtype alone buys; the
    # guard's sabotaged plan on such a CPU. Where the CPU computes bf16 it folds into auto.
    Spec(
        "auto-stock-dtype",
        "plan",
        f"planner's auto layout served in {STOCK_DTYPE}, as stock is, whatever this CPU computes",
        dtype=STOCK_DTYPE,
    ),
    # The plan with n-gram speculation (core/speculation.py), which the planner leaves
    # off by default: what it gains or costs on this workload, and that it answers alike.
    Spec(
        "auto-ngram",
        "plan",
        "planner's auto layout with n-gram speculation (4 tokens from prompt lookup)",
        speculation="ngram",
    ),
    Spec("zen-auto", "plan", "zen image, the planner's auto layout", target="zen"),
    Spec("zen-single", "plan", "zen image, one instance on all cores", target="zen", instances=1),
    # AMD PACE's plugin on its own vLLM pin (0.28.0; the others run 0.32.0).
    Spec("pace-auto", "plan", "pace image (vLLM 0.28), the planner's auto layout", target="pace"),
    Spec(
        "vllm-dp",
        "dp",
        "vLLM's own data parallel: one container, one rank per planner slice",
    ),
    # One copy split, against the replicas the planner keeps while a copy fits a node: a
    # rank per NUMA node, as the planner splits a copy that fits none (two ranks, one per
    # half of the cores, on a one-node host).
    Spec(
        "vllm-tp",
        "tp",
        "vLLM's tensor parallel: one copy, one rank per NUMA node (per half of a lone node)",
        instances="ranks",
    ),
    Spec(
        "vllm-pp",
        "pp",
        "vLLM's pipeline parallel in one host: one copy, a stage per NUMA node (per half "
        "of a lone node)",
        instances="ranks",
    ),
    Spec(
        "llamacpp",
        "llamacpp",
        "llama.cpp's llama-server on the same weights as GGUF bf16, a thread per core",
        target="llamacpp",
        gguf="bf16",
    ),
    Spec(
        "llamacpp-q8",
        "llamacpp",
        "llama-server on the weights quantized to GGUF Q8_0 (half the bytes per step)",
        target="llamacpp",
        gguf="q8_0",
    ),
    Spec("gateway", "gateway", "deploy.yml's nginx gateway over the planned instances"),
)
SPECS = {s.name: s for s in CATALOGUE}
QUICK_CONFIGS = (STOCK, PLANNER, "vllm-dp", "llamacpp", "gateway")

# A pooling model's: stock vLLM with its runner named (vLLM's pooling docs' flag), the
# planner's plan for the pooling model (its containers get --runner=pooling from the
# launcher), and infinity-emb as its docs run it on a CPU (bench/layouts.py's
# infinity_server) over the same weights exported to ONNX.
POOLING_CATALOGUE = (
    Spec(STOCK, "stock", "vLLM's docs: one container, all CPUs, default env, --runner pooling"),
    Spec(PLANNER, "plan", "planner's auto layout for the pooling model"),
    Spec(
        INFINITY,
        "infinity",
        "infinity-emb's server, ONNX engine (its CPU advice) on the same weights as ONNX",
        target=INFINITY,
    ),
)
POOLING_SPECS = {s.name: s for s in POOLING_CATALOGUE}
