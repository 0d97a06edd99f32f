"""How one copy of the model is split: over how many NUMA nodes (vLLM's tensor parallel).

Replicas first: while one copy fits a node, each node serves whole copies (decode reads
every weight once per step, and a copy reads its own node's memory). A copy that fits
no node is split with vLLM's tensor parallel, one rank per node, as vLLM's CPU guide
runs it (`--tensor-parallel-size` equal to the nodes used, `VLLM_CPU_OMP_THREADS_BIND`
one CPU list per rank split by '|'): each rank holds 1/k of the weights and of the KV
cache per token on its own node. k is the smallest power of two (vLLM 0.32 on CPU does
not support TP=6, and heads divide by powers of two) whose shard, runtime, shm and the
minimum KV cache fit every node used; the operator may ask for more (latency: each
rank streams 1/k of the weights per step). A model no k fits is refused with the number
of such hosts that would hold it. Pure; standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from zenvllm.core.errors import PlanError
from zenvllm.core.host import Host
from zenvllm.core.memory import gib, node_budget, smallest_instance
from zenvllm.core.model import Model
from zenvllm.core.policy import Policy


@dataclass(frozen=True)
class Split:
    tensor: int  # ranks per copy, one per NUMA node (1: whole copies)
    nodes: tuple[int, ...]  # the nodes that serve, in the order their ranks group
    why: str


def shard(model: Model, k: int) -> Model:
    """One rank's part of a copy split k ways: its weights and KV bytes per token. The
    weight files are read whole by every rank, so their page cache stays the files'."""
    if k == 1:
        return model
    return replace(
        model,
        weight_bytes=math.ceil(model.weight_bytes / k),
        float_bytes=None if model.float_bytes is None else math.ceil(model.float_bytes / k),
        kv_bytes_per_token=math.ceil(model.kv_bytes_per_token / k)
        if model.kv_bytes_per_token
        else model.kv_bytes_per_token,
        file_bytes=model.weight_bytes if model.file_bytes is None else model.file_bytes,
    )


def fits(host: Host, node_ids: list[int], model: Model, policy: Policy) -> bool:
    """Whether one instance of `model` (a copy or a rank's shard) fits each of the nodes."""
    need = smallest_instance(model, policy)
    return all(node_budget(host.node(n).mem_total_bytes, policy) >= need for n in node_ids)


def powers_of_two(up_to: int) -> list[int]:
    return [1 << i for i in range(up_to.bit_length()) if 1 << i <= up_to]


def split(host: Host, model: Model, policy: Policy, nodes: list[int]) -> Split:
    """The tensor parallel size for `model` on the nodes with usable cores, and why."""
    asked = policy.tensor_parallel
    if asked is not None:
        if asked > len(nodes) or asked not in powers_of_two(len(nodes)):
            raise PlanError(
                f"--tensor-parallel {asked}: this host has {len(nodes)} NUMA node(s) with "
                f"usable CPUs and a rank takes one node; give a power of two up to "
                f"{powers_of_two(len(nodes))[-1]}, or auto"
            )
        return Split(asked, used(nodes, asked), f"tensor parallel {asked}: asked for")
    if model.weight_bytes <= 0 or fits(host, nodes, model, policy):
        return Split(1, tuple(nodes), "")
    for k in powers_of_two(len(nodes))[1:]:
        if fits(host, nodes, shard(model, k), policy):
            return Split(
                k,
                used(nodes, k),
                f"tensor parallel {k}: one copy ({model.weight_gib:.1f} GiB) fits no NUMA "
                f"node, so each copy is split over {k} nodes, one rank per node holding "
                f"{shard(model, k).weight_gib:.1f} GiB of its weights in the node's own "
                "memory (vLLM's CPU guide: one rank per node)",
            )
    raise PlanError(beyond(host, model, policy, nodes))


def used(nodes: list[int], k: int) -> tuple[int, ...]:
    """The nodes whole groups of k ranks take; the rest would hold a partial copy."""
    return tuple(nodes[: len(nodes) // k * k])


def beyond(host: Host, model: Model, policy: Policy, nodes: list[int]) -> str:
    """The refusal of a model no split of this host holds: the numbers, and how many
    hosts of this kind would hold its weights."""
    k = powers_of_two(len(nodes))[-1]
    part = shard(model, k)
    need = smallest_instance(part, policy)
    small = min((host.node(n) for n in nodes), key=lambda n: node_budget(n.mem_total_bytes, policy))
    room = sum(
        max(0, node_budget(host.node(n).mem_total_bytes, policy) - (need - part.weight_bytes))
        for n in nodes
    )
    hosts = max(2, math.ceil(model.weight_bytes / room)) if room > 0 else None
    across = (
        f"; {hosts} hosts of this kind would hold its weights (pipeline parallel across "
        "hosts: not planned by zenvllm yet)"
        if hosts
        else ""
    )
    split_over = f" even split over its {k} usable NUMA nodes" if k > 1 else ""
    return (
        f"the model does not fit this host{split_over}: {'each rank' if k > 1 else 'one copy'} "
        f"needs {gib(need)} "
        f"(weights {gib(part.weight_bytes)}, runtime {policy.runtime_overhead_gib:g} GiB, shm "
        f"{policy.shm_size_mib} MiB, KV {policy.min_kv_cache_gib} GiB minimum) but node "
        f"{small.id} has {gib(node_budget(small.mem_total_bytes, policy))} usable of "
        f"{gib(small.mem_total_bytes)}{across}. Use a smaller or quantized model, or hosts "
        "with more memory per NUMA node"
    )
