"""How much memory each instance gets, and the one function that sizes the KV cache."""

from __future__ import annotations

import math

from zenvllm.core.errors import PlanError
from zenvllm.core.host import GIB, MIB, Host, Node
from zenvllm.core.model import POOLING, Model
from zenvllm.core.policy import Policy


def node_budget(mem_total: int, policy: Policy) -> int:
    reserve = policy.os_reserve_gib * GIB + policy.os_reserve_fraction * mem_total
    return int(mem_total - reserve)


def fixed_cost(model: Model, policy: Policy) -> int:
    """What every instance costs before its KV cache."""
    return int(model.weight_bytes + policy.runtime_overhead_gib * GIB + policy.shm_size_mib * MIB)


def kv_floor_gib(model: Model, policy: Policy) -> int:
    """The least KV cache an instance runs with: none for a pooling model (an encoder's
    attention caches nothing between steps; vLLM 0.32 allocates none, measured with
    VLLM_CPU_KVCACHE_SPACE=0 on all-MiniLM-L6-v2), else the policy's minimum."""
    return 0 if model.runner == POOLING else policy.min_kv_cache_gib


def smallest_instance(model: Model, policy: Policy) -> int:
    """One instance at the minimum KV cache: what a node must hold to run it at all."""
    return fixed_cost(model, policy) + kv_floor_gib(model, policy) * GIB


def kv_need_gib(model: Model, policy: Policy, max_len: int | None) -> int | None:
    """The most KV cache the scheduler can fill: max_num_seqs sequences of max_len."""
    if model.runner == POOLING:
        return 0
    if not (model.kv_bytes_per_token and max_len):
        return None
    return math.ceil(policy.max_num_seqs * max_len * model.kv_bytes_per_token / GIB)


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def instances_that_fit(
    node: Node, k: int, budget: int, model: Model, policy: Policy, total: int
) -> int:
    """How many of the node's k instances its memory holds at the minimum KV cache; a
    PlanError when none does, or when an explicit --instances asks for more."""
    smallest = smallest_instance(model, policy)
    fit = budget // smallest
    if fit < 1:
        raise PlanError(
            f"the model does not fit node {node.id}: one instance needs "
            f"{gib(smallest)} (weights {gib(model.weight_bytes)}, runtime "
            f"{policy.runtime_overhead_gib:g} GiB, shm {policy.shm_size_mib} MiB, KV "
            f"{kv_floor_gib(model, policy)} GiB minimum) but the node has {gib(budget)} "
            f"usable of {gib(node.mem_total_bytes)}. Use a smaller or quantized model, "
            "or a flavor with more memory per NUMA node"
        )
    if k > fit and policy.instances is not None:
        raise PlanError(
            f"{k} instances on node {node.id} need {gib(k * smallest)} but "
            f"it has {gib(budget)} usable; use --instances {total - k + fit} or fewer, "
            "or a smaller model"
        )
    return min(k, fit)


def node_kv_gib(
    node_id: int, k: int, budget: int, fixed: int, need: int | None, policy: Policy, floor: int
) -> int:
    """KV GiB per instance of a node: an explicit size if it fits, else the node's share
    of what is left, never more than the scheduler can fill."""
    if policy.kv_cache_gib is not None:
        kv = policy.kv_cache_gib
        if k * (fixed + kv * GIB) > budget:
            raise PlanError(
                f"KV cache {kv} GiB x {k} instance(s) on node {node_id} needs "
                f"{gib(k * (fixed + kv * GIB))} but the node has {gib(budget)} usable; "
                f"lower --kv-cache-gib or use fewer instances"
            )
        return kv
    kv = int((budget - k * fixed) * policy.kv_fraction / k // GIB)
    return max(need, floor) if need is not None and need < kv else kv


def cgroup_cap_gib(host: Host, policy: Policy, total: int, charged: int) -> int | None:
    """Each instance's KV GiB under the cgroup memory limit, `charged` per instance
    before its KV; None without a limit."""
    limit = host.cgroup_mem_limit_bytes
    if limit is None:  # 0 is a limit (nothing may be charged), never "unset"
        return None
    room = int((limit * (1 - policy.os_reserve_fraction) - total * charged) * policy.kv_fraction)
    return room // total // GIB if room > 0 else 0


def kv_cache_per_node(
    host: Host, model: Model, policy: Policy, counts: dict[int, int]
) -> tuple[dict[int, int], dict[int, int], list[str], list[str]]:
    """The one place the KV cache is sized: GiB per instance on each node, from the node's
    budget, an explicit --kv-cache-gib, what max_num_seqs x max_model_len tokens can use
    and the cgroup limit. Returns (instances per node, lowered where memory fits fewer;
    KV GiB per node; warnings; notes), or a PlanError with the numbers."""
    counts = dict(counts)
    warnings: list[str] = []
    notes: list[str] = []
    fixed = fixed_cost(model, policy)
    need = kv_need_gib(model, policy, policy.max_model_len or model.max_model_len)
    kv_by_node: dict[int, int] = {}
    for node_id, k in counts.items():
        node = host.node(node_id)
        budget = node_budget(node.mem_total_bytes, policy)
        fit = instances_that_fit(node, k, budget, model, policy, sum(counts.values()))
        if fit < k:
            warnings.append(f"node {node_id}: memory fits {fit} instance(s), not {k}")
            counts[node_id] = fit
        floor = kv_floor_gib(model, policy)
        kv_by_node[node_id] = node_kv_gib(node_id, fit, budget, fixed, need, policy, floor)

    cap = cgroup_cap_gib(host, policy, sum(counts.values()), fixed)
    limit = host.cgroup_mem_limit_bytes
    if cap is not None and limit is not None and cap < max(kv_by_node.values()):
        notes.append(f"KV capped at {cap} GiB by the cgroup memory limit {gib(limit)}")
        kv_by_node = {n: min(kv, cap) for n, kv in kv_by_node.items()}

    for node_id, kv in kv_by_node.items():
        if kv < kv_floor_gib(model, policy):
            size = f"{gib(fixed)} each"
            where = (
                f"node {node_id}"
                if host.cgroup_mem_limit_bytes is None
                else f"the cgroup memory limit {gib(host.cgroup_mem_limit_bytes)}"
            )
            raise PlanError(
                f"KV cache would be {kv} GiB per instance, below the {policy.min_kv_cache_gib} GiB "
                f"minimum: {counts[node_id]} instance(s) of {size} leave too little "
                f"of {where}. Use fewer instances, a smaller or quantized model, or a bigger flavor"
            )
    return counts, kv_by_node, warnings, notes
