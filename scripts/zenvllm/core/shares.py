"""Several models on one host: each gets cores and memory of its own, never shared.

The host is divided into one part per model, and each part is planned as a host of
its own (core/plan.py, unchanged): the cores a part may use (its `allowed_cpus`, SMT
siblings kept together) and each node's memory in proportion to the cores the part
holds there. Physical cores go to the models in the order given, filling each node
before the next, so a small model stays on one node. A model's share is a number of
physical cores, or a weight; without either, its weight is its weight bytes: a model
streams its weights once per decode step, so cores in proportion to them give every
model about the same step time. Every model gets at least one core. Pure; standard
library only.
"""

from __future__ import annotations

import math
from dataclasses import replace

from zenvllm.core.cores import usable_cores
from zenvllm.core.errors import PlanError
from zenvllm.core.host import Host
from zenvllm.core.model import Model
from zenvllm.core.model_list import Share
from zenvllm.core.plan import Plan, make_plan
from zenvllm.core.policy import Policy

Held = list[tuple[int, tuple[int, ...]]]  # (node, one physical core's CPUs), in order


def weight_of(share: Share, model: Model) -> float:
    return share.weight if share.weight is not None else float(max(model.weight_bytes, 1))


def counts(total: int, models: list[Model], shares: list[Share]) -> list[int]:
    """Physical cores per model: the asked counts, the rest by weight (largest
    remainder), at least one each; a PlanError when they cannot all be had."""
    asked = sum(s.cores or 0 for s in shares)
    free = [i for i, s in enumerate(shares) if s.cores is None]
    if asked + len(free) > total:
        raise PlanError(
            f"the models ask for {asked} core(s) and {len(free)} more need one each, but "
            f"the host has {total} usable physical core(s); ask for fewer cores or fewer models"
        )
    weights: dict[int, float] = {i: weight_of(shares[i], models[i]) for i in free}
    out = [s.cores or 0 for s in shares]
    rest, spread = total - asked, sum(weights.values())
    exact = {i: rest * w / spread for i, w in weights.items()} if spread else {}
    for i in free:
        out[i] = max(1, math.floor(exact[i]))
    # Largest remainders first, then the cores the floors of 1 took back from the largest.
    for i in sorted(free, key=lambda i: exact[i] - math.floor(exact[i]), reverse=True):
        if sum(out) < total:
            out[i] += 1
    while sum(out) > total:
        biggest = max(free, key=lambda i: out[i])
        out[biggest] -= 1
    return out


def divide(host: Host, models: list[Model], shares: list[Share]) -> list[tuple[Host, str]]:
    """One part of the host per model, in order, and why it is that size."""
    if len({s.name for s in shares}) != len(shares):
        raise PlanError("two models share a served name; give each --model NAME=DIR its own NAME")
    nodes = usable_cores(host)
    ordered = [(node, core) for node, cores in nodes.items() for core in cores]
    wanted = counts(len(ordered), models, shares)
    parts, start = [], 0
    for share, model, n in zip(shares, models, wanted, strict=True):
        mine = ordered[start : start + n]
        start += n
        parts.append((part_of(host, nodes, mine), explain(share, model, mine, len(ordered))))
    return parts


def part_of(host: Host, nodes: dict[int, list[tuple[int, ...]]], mine: Held) -> Host:
    """The host as one model sees it: its cores allowed, each node's memory in proportion."""
    held = {node: sum(1 for n, _ in mine if n == node) for node in nodes}
    scale = {node: held[node] / len(cores) for node, cores in nodes.items()}
    parted = tuple(
        replace(
            n,
            mem_total_bytes=int(n.mem_total_bytes * scale.get(n.id, 0)),
            mem_free_bytes=int(n.mem_free_bytes * scale.get(n.id, 0)),
        )
        for n in host.nodes
    )
    share = sum(held.values()) / sum(len(c) for c in nodes.values())
    limit = host.cgroup_mem_limit_bytes
    return replace(
        host,
        nodes=parted,
        allowed_cpus=frozenset(cpu for _, core in mine for cpu in core),
        allowed_mems=frozenset(n for n in host.allowed_mems if held.get(n)),
        mem_total_bytes=int(host.mem_total_bytes * share),
        mem_available_bytes=int(host.mem_available_bytes * share),
        cgroup_mem_limit_bytes=None if limit is None else int(limit * share),
    )


def explain(share: Share, model: Model, mine: Held, total: int) -> str:
    by = (
        f"{share.cores} core(s) asked"
        if share.cores is not None
        else f"weight {share.weight:g}"
        if share.weight is not None
        else f"its {model.weight_gib:.2f} GiB of weights"
    )
    nodes = sorted({node for node, _ in mine})
    return (
        f"{share.name}: {len(mine)} of {total} physical cores ({by}) on node(s) "
        f"{', '.join(map(str, nodes))}, with that share of each node's memory"
    )


def plan_models(
    host: Host, models: list[Model], shares: list[Share], policies: list[Policy]
) -> list[Plan]:
    """Each model planned on its part of the host with its own policy, its instances
    numbered on from the previous model's (names and ports: one deployment's instances
    are <deployment>-0, -1, ... whatever model each serves)."""
    plans: list[Plan] = []
    first = 0
    parts = divide(host, models, shares)
    for (part, why), model, policy in zip(parts, models, policies, strict=True):
        plan = make_plan(part, model, replace(policy, first_index=first))
        plans.append(replace(plan, notes=(why, *plan.notes)))
        first += len(plan.instances)
    return plans
