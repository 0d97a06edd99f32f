"""What a plan says of itself: why its instances are counted as they are (and which
nodes stay idle), what a KV cache holds, what the weights take in the dtype served, and
what the layout is predicted to serve. Pure."""

from __future__ import annotations

import math
from dataclasses import replace

from zenvllm.core import performance
from zenvllm.core.cores import Cores, cores_needed, cores_per_instance
from zenvllm.core.host import GIB, Host
from zenvllm.core.memory import gib
from zenvllm.core.model import POOLING, Model
from zenvllm.core.performance import Layout, Load, Machine, Shape
from zenvllm.core.policy import Policy
from zenvllm.core.topology import format_cpu_list

# The bench's workload, each instance's share: what the note predicts without a --load.
BENCH_LOAD = Load(prompt=128, output=128, concurrency=16)


def layout_notes(
    host: Host,
    cores: Cores,
    counts: dict[int, int],
    model: Model,
    policy: Policy,
    per_instance: int,
) -> tuple[list[str], list[str]]:
    """Why the instances are counted as they are; which nodes stay idle."""
    warnings: list[str] = []
    notes: list[str] = []
    if policy.instances is None and model.runner == POOLING:
        notes.append(
            f"auto: a pooling model ({model.runner_why}) has no decode step to keep under "
            f"{policy.tpot_target_ms:g} ms: its step is one prefill over the batch, bound by "
            f"compute, so one instance per node (up to {policy.max_cores_per_instance} "
            "cores) uses every core, with no KV cache"
        )
    elif policy.instances is None:
        by_bandwidth = cores_per_instance(model, policy)
        floor = (
            f"; without SMT at least {per_instance}, as a 1-core instance's API server and "
            "scheduler would share its only core"
            if per_instance > by_bandwidth
            else ""
        )
        notes.append(
            f"auto: {model.weight_gib:.2f} GiB of weights need "
            f"{by_bandwidth} core(s) per instance to keep a decode step "
            f"under {policy.tpot_target_ms:g} ms at ~{policy.core_bandwidth_gbs:g} GB/s per "
            f"core (cap {policy.max_cores_per_instance}){floor}; that bandwidth is "
            f"{policy.bandwidth_source}"
        )
        needed = cores_needed(model, policy)
        starved = [node for node, c in cores.items() if needed > len(c)]
        if starved:
            notes.append(
                f"nodes {format_cpu_list(starved)}: one copy each, as their cores cannot stream "
                f"the weights within the target ({needed} needed): a second copy would halve "
                "each copy's bandwidth and double the bytes read per token, where one copy's "
                "larger batch reads them once"
            )
    idle = sorted(set(cores) - set(counts))
    if idle:
        warnings.append(f"nodes {idle} get no instance with --instances {policy.instances}")
    for node in host.nodes:
        if not node.cpus and node.mem_total_bytes:
            notes.append(
                f"node {node.id} has {gib(node.mem_total_bytes)} but no CPUs; unused "
                "(each instance keeps its memory on its own CPUs' node)"
            )
    if model.weight_bytes <= 0:
        warnings.append("model size unknown: no memory set aside for weights; pass --model")
    return warnings, notes


def room_for(kv_gib: int, model: Model) -> str:
    """ ", room for N tokens" in a KV cache of kv_gib (of this model, or rank's shard)."""
    per_token = model.kv_bytes_per_token
    return f", room for {kv_gib * GIB // per_token:,} tokens" if per_token else ""


def dtype_note(why: str, stored: Model, served: Model) -> str:
    if stored.weight_bytes == served.weight_bytes or served.weight_bytes <= 0:
        return why
    return (
        f"{why}; the weights take {served.weight_gib:.2f} GiB so "
        f"({stored.weight_gib:.2f} GiB stored as {stored.dtype})"
    )


def prediction_note(machine: Machine, shape: Shape, layout: Layout, load: Load | None) -> str:
    """TPOT at batch 1 and the plan's output tok/s at the load (the bench's without one),
    and where the figures come from."""
    if load is None:
        load = replace(BENCH_LOAD, concurrency=BENCH_LOAD.concurrency * layout.instances)
        at = "16 requests per instance of 128 in / 128 out (the bench's workload; --load for yours)"
    else:
        at = f"--load {load.text}"
    alone = performance.predict(shape, machine, layout, load, 1)
    batch = performance.batch_of(shape, machine, layout, load)
    if math.isinf(batch):
        serves = f"at {at} more requests arrive than the plan serves at any batch"
    else:
        it = performance.predict(shape, machine, layout, load, batch)
        serves = (
            f"at {at} the plan makes {it.output_tok_s:,.0f} output tok/s, TPOT "
            f"{it.tpot_ms:,.0f} ms, TTFT {it.ttft_ms:,.0f} ms"
        )
    return (
        f"predicted by core/performance.py (fitted on the 2-core bench runs, within "
        f"{performance.ERROR_BOUND:.0%} of each): one request alone gets a token every "
        f"{alone.tpot_ms:,.0f} ms on an instance of {layout.cores} core(s); {serves}; from "
        f"{machine.core_gbs:g} GB/s per core ({machine.bandwidth_source}) and "
        f"{machine.compute.gflops:g} GFLOP/s per core of prefill ({machine.compute.source})"
    )
