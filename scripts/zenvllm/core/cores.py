"""Which cores each instance gets: physical cores per node, slices, OpenMP's CPUs."""

from __future__ import annotations

import math
from collections import defaultdict

from zenvllm.core.errors import PlanError
from zenvllm.core.host import Host
from zenvllm.core.model import POOLING, Model
from zenvllm.core.policy import Policy

# Node id -> its physical cores, each the sorted tuple of its allowed logical CPUs.
Cores = dict[int, list[tuple[int, ...]]]


def usable_cores(host: Host) -> Cores:
    """Node id -> its physical cores (each a sorted tuple of allowed logical CPUs),
    ordered by L3 domain then first CPU, so contiguous slices fill L3s in turn."""
    by_core: dict[int, list[int]] = defaultdict(list)
    for cpu in host.cpus:
        if cpu.id in host.allowed_cpus:
            by_core[cpu.core].append(cpu.id)
    nodes: dict[int, list[tuple[int, ...]]] = defaultdict(list)
    for ids in by_core.values():
        first = host.cpu(min(ids))
        nodes[first.node].append(tuple(sorted(ids)))
    for cores in nodes.values():
        cores.sort(key=lambda ids: (host.cpu(ids[0]).l3, ids[0]))
    return dict(sorted(nodes.items()))


def split_cores(cores: list[tuple[int, ...]], k: int, layout: str) -> list[list[tuple[int, ...]]]:
    """k near-equal slices: consecutive cores (contiguous) or every k-th (interleaved)."""
    if layout == "interleaved":
        return [cores[i::k] for i in range(k)]
    size, extra = divmod(len(cores), k)
    slices, start = [], 0
    for i in range(k):
        end = start + size + (1 if i < extra else 0)
        slices.append(cores[start:end])
        start = end
    return slices


def omp_cpus_of(slice_cores: list[tuple[int, ...]], policy: Policy) -> tuple[int, ...]:
    """OpenMP's CPUs: the highest sibling of each core (as vLLM's auto picks); without
    SMT, a slice of `reserve_from_cores` or more leaves its last `reserve_cpus` cores to
    the API server and scheduler."""
    omp = [ids[-1] for ids in slice_cores]
    if not any(len(ids) > 1 for ids in slice_cores) and len(omp) >= policy.reserve_from_cores:
        omp = omp[: len(omp) - policy.reserve_cpus]
    return tuple(sorted(omp))


def cores_needed(model: Model, policy: Policy) -> int:
    """Cores whose bandwidth streams the weights within the step target, uncapped (0 when
    the model's size is unknown)."""
    if model.runner == POOLING:
        return 0  # no decode step to keep under the target
    per_core_step = policy.core_bandwidth_gbs * 1e9 * policy.tpot_target_ms / 1000
    return max(0, math.ceil(model.weight_bytes / per_core_step))


def cores_per_instance(model: Model, policy: Policy, smt: bool = True) -> int:
    """The fewest cores that stream the weights within the step target; without SMT at
    least `min_cores_without_smt`, since a 1-core instance's API server and scheduler
    take turns with its only OpenMP thread."""
    if model.weight_bytes <= 0 or model.runner == POOLING:
        # A pooler's step is one prefill over its batch: compute-bound matmuls that use
        # every core given, no weights re-read per token. One instance per node (up to
        # the cap) runs them as well as slices would, with one runtime, not one per slice.
        return policy.max_cores_per_instance
    least = 1 if smt else policy.min_cores_without_smt
    return max(least, min(policy.max_cores_per_instance, cores_needed(model, policy)))


def instances_per_node(
    cores: dict[int, list[tuple[int, ...]]], policy: Policy, per_instance: int, needed: int = 0
) -> dict[int, int]:
    """Auto: as many slices of at least `per_instance` cores (and at most the cap) as fit
    each node, but one copy on a node whose cores cannot stream the weights in time
    (`needed` more than it has): a second copy there would halve each one's bandwidth and
    double the weights read per token. Explicit counts: spread over nodes by their core
    counts (largest remainder)."""
    total_cores = sum(len(c) for c in cores.values())
    n = policy.instances
    if n is None:
        cap = policy.max_cores_per_instance
        return {
            node: 1
            if needed > len(c)
            else min(len(c), max(1, len(c) // per_instance, math.ceil(len(c) / cap)))
            for node, c in cores.items()
        }
    if n > total_cores:
        raise PlanError(
            f"--instances {n} is more than the {total_cores} usable physical cores; "
            f"give at most {total_cores}"
        )
    if n <= len(cores):  # fewer instances than nodes: the biggest nodes get one each
        biggest = sorted(cores, key=lambda node: (-len(cores[node]), node))[:n]
        return {node: 1 for node in sorted(biggest)}
    shares = {node: n * len(c) / total_cores for node, c in cores.items()}
    counts = {node: max(1, math.floor(s)) for node, s in shares.items()}
    # One per node can take more than the small nodes' shares: give it back from the
    # nodes furthest over theirs (n > nodes, so every node keeps one).
    while sum(counts.values()) > n:
        over = max(
            (node for node in counts if counts[node] > 1),
            key=lambda node: (counts[node] - shares[node], node),
        )
        counts[over] -= 1
    by_remainder = sorted(shares, key=lambda node: (counts[node] - shares[node], node))
    for node in by_remainder[: n - sum(counts.values())]:
        counts[node] += 1
    return {node: min(k, len(cores[node])) for node, k in counts.items()}
