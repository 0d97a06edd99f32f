"""How one copy of the model is split: over how many hosts (vLLM's pipeline parallel) and
over how many NUMA nodes of each (vLLM's tensor parallel).

Replicas first: while one copy fits a node, each node serves whole copies (decode reads
every weight once per step, and a copy reads its own node's memory). A copy that fits
no node is split with vLLM's tensor parallel, one rank per node, as vLLM's CPU guide
runs it (`--tensor-parallel-size` equal to the nodes used, `VLLM_CPU_OMP_THREADS_BIND`
one CPU list per rank split by '|'): each rank holds 1/k of the weights and of the KV
cache per token on its own node. k is the smallest power of two (vLLM 0.32 on CPU does
not support TP=6, and heads divide by powers of two) whose shard, runtime, shm and the
minimum KV cache fit every node used; the operator may ask for more (latency: each
rank streams 1/k of the weights per step). A model no k fits is refused with the number
of such hosts that would hold it and the option that plans across them.

A copy that no host of this kind holds is cut into p pipeline stages, one per host
(`--hosts N` allows up to N), each holding 1/p of the layers: the fewest stages whose
part fits a host, split again over its nodes as above where one node does not hold it.
Stages pass only each token's activations between hosts, where tensor parallel would
exchange partial sums twice per layer, so hosts are joined by stages and nodes by ranks
(vLLM's multi-node guide: TP within a machine, PP across machines). Pure; standard
library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from zenvllm.core.errors import PlanError
from zenvllm.core.host import Host
from zenvllm.core.memory import gib, kv_floor_gib, node_budget, smallest_instance
from zenvllm.core.model import Model
from zenvllm.core.policy import Policy


@dataclass(frozen=True)
class Split:
    tensor: int  # ranks per stage, one per NUMA node (1: whole copies or stages)
    nodes: tuple[int, ...]  # the nodes that serve, in the order their ranks group
    why: str
    pipeline: int = 1  # stages per copy, one per host


def shard(model: Model, k: int) -> Model:
    """One rank's part of a copy split k ways: its weights and KV bytes per token."""
    if k == 1:
        return model
    return replace(
        model,
        weight_bytes=math.ceil(model.weight_bytes / k),
        float_bytes=None if model.float_bytes is None else math.ceil(model.float_bytes / k),
        kv_bytes_per_token=math.ceil(model.kv_bytes_per_token / k)
        if model.kv_bytes_per_token
        else model.kv_bytes_per_token,
    )


def stage(model: Model, p: int) -> Model:
    """One host's part of a copy cut into p pipeline stages: 1/p of the layers, so of the
    weights and of the KV bytes per token."""
    return shard(model, p)


def fits(host: Host, node_ids: list[int], model: Model, policy: Policy) -> bool:
    """Whether one instance of `model` (a copy or a rank's shard) fits each of the nodes."""
    need = smallest_instance(model, policy)
    return all(node_budget(host.node(n).mem_total_bytes, policy) >= need for n in node_ids)


def powers_of_two(up_to: int) -> list[int]:
    return [1 << i for i in range(up_to.bit_length()) if 1 << i <= up_to]


def split(host: Host, model: Model, policy: Policy, nodes: list[int]) -> Split:
    """The pipeline and tensor parallel sizes for `model` on the nodes with usable cores
    of `policy.hosts` hosts of this kind, and why."""
    asked = policy.tensor_parallel
    if asked is not None and (asked > len(nodes) or asked not in powers_of_two(len(nodes))):
        raise PlanError(
            f"--tensor-parallel {asked}: this host has {len(nodes)} NUMA node(s) with "
            f"usable CPUs and a rank takes one node; give a power of two up to "
            f"{powers_of_two(len(nodes))[-1]}, or auto"
        )
    if model.weight_bytes <= 0:
        return Split(asked or 1, used(nodes, asked or 1), "")
    for p in range(1, policy.hosts + 1):
        part = stage(model, p)
        if asked is None:
            k = tensor_size(host, part, policy, nodes)
        # An asked size is kept on one host: the KV sizing then refuses it with numbers.
        elif policy.hosts == 1 or fits(host, list(used(nodes, asked)), shard(part, asked), policy):
            k = asked
        else:
            k = None
        if k:
            return Split(k, used(nodes, k), why(model, p, k, asked), p)
    raise PlanError(beyond(host, model, policy, nodes))


def tensor_size(host: Host, model: Model, policy: Policy, nodes: list[int]) -> int | None:
    """The fewest ranks (a power of two, one per node) whose shards fit; None if none."""
    for k in powers_of_two(len(nodes)):
        if fits(host, list(used(nodes, k)), shard(model, k), policy):
            return k
    return None


def why(model: Model, p: int, k: int, asked: int | None) -> str:
    """The plan's note on the split chosen ("" for whole copies on one host)."""
    part = stage(model, p)
    ranks = (
        f"tensor parallel {k}: asked for"
        if asked is not None
        else f"tensor parallel {k}: {'one stage' if p > 1 else 'one copy'} "
        f"({part.weight_gib:.1f} GiB) fits no NUMA node, so it is split over {k} nodes, one "
        f"rank per node holding {shard(part, k).weight_gib:.1f} GiB of its weights in the "
        "node's own memory (vLLM's CPU guide: one rank per node)"
        if k > 1
        else ""
    )
    if p == 1:
        return ranks
    stages = (
        f"pipeline parallel {p}: one copy ({model.weight_gib:.1f} GiB) fits no single host "
        f"of this kind, so it is cut into {p} stages, one per host, each holding "
        f"{part.weight_gib:.1f} GiB of its layers (vLLM's multi-node launch: the head host "
        "serves, the others join it headless; only activations cross between hosts)"
    )
    return f"{stages}; {ranks}" if ranks else stages


def used(nodes: list[int], k: int) -> tuple[int, ...]:
    """The nodes whole groups of k ranks take; the rest would hold a partial copy."""
    return tuple(nodes[: len(nodes) // k * k])


def beyond(host: Host, model: Model, policy: Policy, nodes: list[int]) -> str:
    """The refusal of a model that no split over `policy.hosts` hosts of this kind holds:
    the numbers, and how many such hosts would hold it."""
    k, p = powers_of_two(len(nodes))[-1], policy.hosts
    part = shard(stage(model, p), k)
    need = smallest_instance(part, policy)
    small = min((host.node(n) for n in nodes), key=lambda n: node_budget(n.mem_total_bytes, policy))
    cut = f" in {p} stages, one per host" + ("," if k > 1 else "") if p > 1 else ""
    over = f" split over its {k} usable NUMA nodes" if k > 1 else ""
    who = "each rank" if k > 1 else "each stage" if p > 1 else "one copy"
    hosts = hosts_needed(host, model, policy, nodes)
    across = (
        f"; {hosts} hosts of this kind would hold it, one pipeline stage each: plan across "
        f"them with --hosts {hosts}"
        if hosts
        else ""
    )
    return (
        f"the model does not fit {'these hosts' if p > 1 else 'this host'}"
        f"{' even' if cut or over else ''}{cut}{over}: {who} needs {gib(need)} "
        f"(weights {gib(part.weight_bytes)}, runtime {policy.runtime_overhead_gib:g} GiB, shm "
        f"{policy.shm_size_mib} MiB, KV {kv_floor_gib(part, policy)} GiB minimum) but node "
        f"{small.id} has {gib(node_budget(small.mem_total_bytes, policy))} usable of "
        f"{gib(small.mem_total_bytes)}{across}. Use a smaller or quantized model, or hosts "
        "with more memory per NUMA node"
    )


MAX_HOSTS = 4096  # beyond any fleet: the search for the hosts a model needs stops here


def hosts_needed(host: Host, model: Model, policy: Policy, nodes: list[int]) -> int | None:
    """The fewest hosts of this kind whose pipeline stages hold the model (None: more than
    MAX_HOSTS, as when the runtime alone fills a node)."""
    low = max(2, policy.hosts + 1)
    return next(
        (p for p in range(low, MAX_HOSTS + 1) if tensor_size(host, stage(model, p), policy, nodes)),
        None,
    )
