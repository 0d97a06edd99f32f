"""The embedding bench's configurations: stock vLLM, the planner's layout, and infinity.

Pure, like bench/layouts.py, whose servers it reuses: stock is vLLM's CPU guide's
`docker run` with `--runner pooling` (vLLM's pooling docs' flag), the planner's layout
is the plan `zenvllm plan` makes for the pooling model (its containers get
`--runner=pooling` from the launcher), and the peer is infinity-emb's server as its
docs run it on a CPU: the ONNX engine (`--engine optimum`, what its CPU image sets)
over the same weights exported to ONNX, its default batch size, every usable core.
"""

from __future__ import annotations

from dataclasses import replace

from zenvllm.bench.catalogue import PLANNER, SPECS, STOCK
from zenvllm.bench.layouts import Configuration, Server, policy_of, servers_of, stock_server
from zenvllm.core.cores import usable_cores
from zenvllm.core.errors import PlanError, UserError
from zenvllm.core.host import Host
from zenvllm.core.model import Model
from zenvllm.core.plan import Policy, make_plan
from zenvllm.core.topology import format_cpu_list

PEER = "infinity"
CONFIGS = (STOCK, PLANNER, PEER)
SUMMARIES = {
    STOCK: "vLLM's docs: one container, all CPUs, default env, --runner pooling",
    PLANNER: "planner's auto layout for the pooling model",
    PEER: "infinity-emb's server, ONNX engine (its CPU advice) on the same weights as ONNX",
}
# infinity's --batch-size default: the most inputs it runs in one forward pass.
INFINITY_BATCH = 32


def parse_configs(text: str | None) -> list[str]:
    if not text:
        return list(CONFIGS)
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise UserError(
            f"--configs: {unknown[0]!r} is not an embedding configuration; choose from "
            f"{', '.join(CONFIGS)}"
        )
    if STOCK not in names:
        raise UserError(f"--configs {text}: include {STOCK!r}, the baseline every ratio divides by")
    return names


def stock_embed_server(port: int) -> Server:
    """vLLM's guide's command for an embedding model: its runner named."""
    return replace(stock_server(port), serve_args=("--runner", "pooling"))


def infinity_server(host: Host, port: int, pooling: str) -> Server:
    """infinity-emb on every usable CPU: ONNX Runtime sizes its thread pool by the cores
    it finds (infinity has no thread option); batches of up to INFINITY_BATCH inputs (its
    default); `pooling` as the model's sentence-transformers Pooling module says (its
    ONNX engine would take the CLS token otherwise); token counts by its tokenizer
    (--lengths-via-tokenize; by default it reports characters), so tokens/s compares."""
    cores = usable_cores(host)
    cpus = format_cpu_list(sorted(c for ids in cores.values() for core in ids for c in core))
    return Server(
        name=f"zenvllm-bench-infinity-{port}",
        port=port,
        cpus=cpus,
        omp_bind=cpus,
        mems=format_cpu_list(sorted(cores)),
        kv_cache_gib=0,
        env={},
        docker_args=(f"--cpuset-cpus={cpus}",),
        serve_args=(
            "--engine",
            "optimum",
            "--device",
            "cpu",
            "--batch-size",
            str(INFINITY_BATCH),
            "--pooling-method",
            pooling,
            "--lengths-via-tokenize",
        ),
    )


def resolve(
    names: list[str],
    host: Host,
    model: Model,
    base_port: int,
    max_model_len: int,
    pooling: str,
    base: Policy | None = None,
) -> tuple[list[Configuration], list[str]]:
    """The named configurations on this host (the planner's with the plan for the
    pooling model), and notes on any that could not be planned."""
    configs: list[Configuration] = []
    notes: list[str] = []
    for name in (n for n in CONFIGS if n in names):
        summary = SUMMARIES[name]
        if name == STOCK:
            servers: tuple[Server, ...] = (stock_embed_server(base_port),)
            configs.append(Configuration(name, "stock", summary, "vllm-openai", servers))
        elif name == PEER:
            server = infinity_server(host, base_port, pooling)
            configs.append(Configuration(name, PEER, summary, PEER, (server,)))
        else:
            policy = policy_of(SPECS[name], host, base_port, max_model_len, base or Policy())
            try:
                plan = make_plan(host, model, policy)
            except PlanError as err:
                notes.append(f"{name}: skipped on this host: {err}")
                continue
            configs.append(Configuration(name, "plan", summary, "vllm-openai", servers_of(plan)))
    return configs, notes


def client_kind(config: Configuration) -> str:
    """Which of vLLM's client backends asks this configuration's servers."""
    return PEER if config.kind == PEER else "vllm"


def serves(config: Configuration, infinity_version: str) -> str:
    """What a configuration's servers compute, in words, for the table."""
    if config.kind == PEER:
        return f"infinity-emb {infinity_version}, ONNX Runtime float32 (optimised graph)"
    return f"vLLM {config.servers[0].served_dtype}, --runner pooling"
