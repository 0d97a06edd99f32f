"""Host + Model + Policy -> Plan: how many vLLM instances, where, and how big.

Pure functions over plain data; every decision is explained in `Plan.notes`.
The rules, and the evidence behind their defaults:

* Instances never cross a NUMA node, and every node with usable CPUs gets at
  least one (vLLM's own `auto` does one rank per node too).
* Auto splits a node into slices just big enough for the model: a decode step
  reads every weight once, so a slice of c cores at ~`core_bandwidth_gbs` each
  needs weights / (c x bandwidth) per step. We take the fewest cores that keep
  that under `tpot_target_ms`, capped at `max_cores_per_instance` (AMD measured
  two 64-core instances well ahead of one 128-core instance on an EPYC 9755),
  then as many slices as fill the node. On the 2-core test machine (13.0 GB/s
  per core, calibrated) a 0.5 B model's 0.99 GB step takes 2 cores, and that
  2-core instance made 1.79x of vLLM's stock container against 1.19x for two
  1-core instances (docs/benchmarks.md, real-shape results). Without SMT a slice has at
  least `min_cores_without_smt` (2) cores: a 1-core instance's API server and
  scheduler share its only core, and lost 1.42-1.61x to one 2-core instance
  with every real-shape model there, W8A8 INT8 included.
* OpenMP gets one logical CPU per physical core (the highest sibling, as
  vLLM picks). With SMT the other siblings are left to each instance's API
  server and engine-core (scheduler) processes. Without SMT, slices of
  `reserve_from_cores` cores or more keep `reserve_cpus` cores out of OpenMP
  for them, as vLLM 0.32's auto does for every rank (its scheduler spins while
  the workers compute); smaller slices give OpenMP every core, because a
  reserved core is a large share of their compute: on the 2-core test machine
  keeping one apart cost 29% of the bench model's throughput.
* Memory is planned from each node's total, not its momentary free memory, so
  re-planning a host whose instances already run gives the same plan (and
  Ansible stays idempotent); low free memory is a warning.
* dtype: what the CPU computes natively (core/dtype.py): bfloat16 with AVX512-BF16 or
  AMX, float32 elsewhere (vLLM emulates bf16 there, 4.35x slower on a Zen 3); every size
  below is of the model as served in it.
* KV cache: what the node has left after the OS reserve and every instance's
  weights, runtime and shm, times `kv_fraction`, shared out; never more than
  the model can use (max_num_seqs x max_model_len tokens), never under
  `min_kv_cache_gib`, and within the cgroup memory limit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from zenvllm.core import deployed, parallel, performance, quantization, speculation
from zenvllm.core.container import placement
from zenvllm.core.cores import (
    Cores,
    cores_needed,
    cores_per_instance,
    instances_per_node,
    omp_cpus_of,
    split_cores,
    usable_cores,
)
from zenvllm.core.dtype import (
    EMULATED_BF16_SLOWDOWN,
    EMULATED_BF16_SOURCE,
    doubled,
    served_model,
    serving_dtype,
)
from zenvllm.core.errors import PlanError
from zenvllm.core.host import GIB, MIB, Host
from zenvllm.core.memory import fixed_cost, gib, kv_cache_per_node
from zenvllm.core.model import GENERATE, Model
from zenvllm.core.performance import Layout, Machine
from zenvllm.core.plan_notes import dtype_note, layout_notes, prediction_note, room_for
from zenvllm.core.policy import Policy, check_policy
from zenvllm.core.request import LAYOUTS
from zenvllm.core.targets import TARGETS
from zenvllm.core.topology import format_cpu_list

__all__ = ["LAYOUTS", "Instance", "Plan", "Policy", "make_plan"]


@dataclass(frozen=True)
class Rank:
    """One rank of an instance: its host (its pipeline stage), its node, its cores and
    OpenMP's CPUs among them."""

    node: int
    cpus: tuple[int, ...]
    omp_cpus: tuple[int, ...]
    host: int = 0


@dataclass(frozen=True)
class Instance:
    name: str
    port: int
    node: int
    cpus: tuple[int, ...]  # the container's cpuset (on each of its hosts: they are alike)
    omp_cpus: tuple[int, ...]  # OpenMP threads, one per physical core
    mems: tuple[int, ...]
    kv_cache_gib: int
    shm_size_mib: int
    memory_limit_mib: int
    env: dict[str, str] = field(default_factory=dict)
    dtype: str = "bfloat16"  # vLLM's --dtype
    runner: str = GENERATE  # vLLM's --runner
    # One per node and host its copy is split over (tensor x pipeline parallel).
    ranks: tuple[Rank, ...] = ()
    index: int = 0  # its place in the plan: the name's and the ports' offset

    @property
    def pipeline_parallel_size(self) -> int:
        return max((r.host for r in self.ranks), default=0) + 1

    @property
    def tensor_parallel_size(self) -> int:
        return max(1, len(self.ranks) // self.pipeline_parallel_size)

    @property
    def omp_threads_bind(self) -> str:
        """vLLM's form: one CPU list per rank of a host, split by '|'."""
        ranks = [r for r in self.ranks if r.host == 0] or [
            Rank(self.node, self.cpus, self.omp_cpus)
        ]
        return "|".join(format_cpu_list(r.omp_cpus) for r in ranks)

    @property
    def docker_args(self) -> list[str]:
        return placement(self)  # the container contract's, for the plan's JSON and bench

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            cpus=list(self.cpus),
            omp_cpus=list(self.omp_cpus),
            mems=list(self.mems),
            omp_threads_bind=self.omp_threads_bind,
            docker_args=self.docker_args,
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            ranks=[
                {"host": r.host, "node": r.node, "cpus": list(r.cpus), "omp_cpus": list(r.omp_cpus)}
                for r in self.ranks
            ],
        )
        return d


@dataclass(frozen=True)
class Plan:
    host: Host
    model: Model
    policy: Policy
    instances: tuple[Instance, ...]
    warnings: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def max_model_len(self) -> int | None:
        return self.policy.max_model_len or self.model.max_model_len


def instance_of(
    index: int,
    ranks: list[tuple[int, list[tuple[int, ...]]]],
    mems: tuple[int, ...],
    kv: int,
    limit_bytes: int,
    policy: Policy,
    dtype: str,
    hosts: int = 1,
    runner: str = GENERATE,
) -> Instance:
    """One instance on its ranks' cores (a replica has one rank: its node and slice of
    cores), alike on each of its `hosts` (pipeline stages): names, port, binding, sizes
    and env; its memory limit on a host is `limit_bytes` (everything but the KV cache)
    plus the KV cache of each of its ranks there."""
    index += policy.first_index
    name = f"{policy.name_prefix}-{index}"
    placed = tuple(
        Rank(node, tuple(sorted(c for ids in cores for c in ids)), omp_cpus_of(cores, policy))
        for node, cores in ranks
    )
    cpus = tuple(sorted(c for r in placed for c in r.cpus))
    omp = tuple(sorted(c for r in placed for c in r.omp_cpus))
    memory_mib = math.ceil((limit_bytes + len(placed) * kv * GIB) / MIB)
    # What the container's launcher checks instead of planning again.
    promise = deployed.Promise(
        name,
        policy.target,
        format_cpu_list(cpus),
        format_cpu_list(mems),
        policy.shm_size_mib * len(placed),
        memory_mib,
    )
    instance = Instance(
        name=name,
        port=policy.base_port + index,
        node=placed[0].node,
        cpus=cpus,
        omp_cpus=omp,
        mems=mems,
        kv_cache_gib=kv,
        shm_size_mib=policy.shm_size_mib * len(placed),
        memory_limit_mib=memory_mib,
        dtype=dtype,
        runner=runner,
        index=index,
        ranks=tuple(replace(r, host=h) for h in range(hosts) for r in placed)
        if len(placed) * hosts > 1
        else (),
    )
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(kv),  # per rank
        "VLLM_CPU_OMP_THREADS_BIND": instance.omp_threads_bind,
        **TARGETS[policy.target].env,
        deployed.ENV_KEY: deployed.encode(promise),
    }
    return replace(instance, env=env)


def place(
    host: Host,
    model: Model,
    policy: Policy,
    cores: Cores,
    counts: dict[int, int],
    kv_by_node: dict[int, int],
) -> tuple[list[Instance], list[str], list[str]]:
    """The instances on each node's slices of cores, with its memory node."""
    instances: list[Instance] = []
    warnings: list[str] = []
    notes: list[str] = []
    # No room for the weight files' page cache: the image's vLLM counts it as free, as
    # the kernel does at the limit (runtime/working_set.py).
    limit = fixed_cost(model, policy)
    for node_id, k in counts.items():
        kv = kv_by_node[node_id]
        mems = (node_id,) if node_id in host.allowed_mems else tuple(sorted(host.allowed_mems))
        if mems != (node_id,):
            warnings.append(f"node {node_id}'s memory is outside the cgroup; using nodes {mems}")
        for slice_cores in split_cores(cores[node_id], k, policy.layout):
            index = len(instances)
            instances.append(
                instance_of(
                    index,
                    [(node_id, slice_cores)],
                    mems,
                    kv,
                    limit,
                    policy,
                    model.dtype,
                    runner=model.runner,
                )
            )
        notes.append(
            f"node {node_id}: {k} instance(s) over {len(cores[node_id])} core(s), "
            f"KV {kv} GiB each{room_for(kv, model)}"
        )
    return instances, warnings, notes


def final_checks(
    host: Host, model: Model, policy: Policy, instances: list[Instance]
) -> tuple[list[str], list[str]]:
    """Ports in range (else a PlanError); shared cores and a tight host, said."""
    warnings: list[str] = []
    notes: list[str] = []
    shared = [i.name for i in instances if set(i.cpus) == set(i.omp_cpus)]
    if shared:
        notes.append(
            f"{', '.join(shared)}: under {policy.reserve_from_cores} cores without SMT, OpenMP "
            "gets every core and the API server and scheduler share them (a core kept apart "
            "would be too large a share of the compute)"
        )
    last_port = policy.base_port + len(instances) - 1
    if last_port > 65535:
        raise PlanError(f"ports {policy.base_port}-{last_port} run past 65535; lower --base-port")
    footprint = sum(i.memory_limit_mib * MIB for i in instances)
    if footprint > host.mem_available_bytes:
        warnings.append(
            f"the plan needs {gib(footprint)} but only {gib(host.mem_available_bytes)} is "
            "available now; stop other workloads first"
        )
    return warnings, notes


def place_groups(
    host: Host, model: Model, policy: Policy, cores: Cores, parts: parallel.Split
) -> tuple[list[Instance], list[str], list[str]]:
    """Copies split over hosts and nodes: groups of `parts.tensor` nodes in order, one
    rank per node on all its usable cores, alike on each of `parts.pipeline` hosts, each
    rank sized for its shard of its host's stage."""
    k, part = parts.tensor, parallel.stage(model, parts.pipeline)
    rank_model = parallel.shard(part, k)
    groups = [parts.nodes[i : i + k] for i in range(0, len(parts.nodes), k)]
    if policy.instances is not None:
        groups = groups[: policy.instances]
    counts = {node: 1 for group in groups for node in group}
    counts, kv_by_node, warnings, notes = kv_cache_per_node(host, rank_model, policy, counts)
    limit = k * fixed_cost(rank_model, policy)
    where = f" of each of {parts.pipeline} hosts" if parts.pipeline > 1 else ""
    what = "a stage of a copy" if parts.pipeline > 1 else "one copy"
    instances = []
    for index, group in enumerate(groups):
        kv = min(kv_by_node[node] for node in group)
        ranks = [(node, split_cores(cores[node], 1, policy.layout)[0]) for node in group]
        mems = tuple(n for n in group if n in host.allowed_mems) or tuple(sorted(host.allowed_mems))
        instances.append(
            instance_of(
                index, ranks, mems, kv, limit, policy, model.dtype, parts.pipeline, model.runner
            )
        )
        notes.append(
            f"nodes {format_cpu_list(group)}{where}: {what} in {k} rank(s), "
            f"{rank_model.weight_gib:.2f} GiB of weights and KV {kv} GiB per rank"
            f"{room_for(kv, rank_model)}"
        )
    idle = sorted(set(cores) - set(counts))
    if idle:
        warnings.append(f"nodes {idle} get no rank: the copies take {k} nodes each")
    return instances, [parts.why, *notes], warnings


def place_replicas(
    host: Host, model: Model, policy: Policy, cores: Cores
) -> tuple[list[Instance], list[str], list[str]]:
    """Whole copies: each node split into slices of cores, one instance per slice."""
    per_instance = cores_per_instance(model, policy, host.smt)
    counts = instances_per_node(cores, policy, per_instance, cores_needed(model, policy))
    warnings, notes = layout_notes(host, cores, counts, model, policy, per_instance)
    counts, kv_by_node, kv_warnings, kv_notes = kv_cache_per_node(host, model, policy, counts)
    instances, place_warnings, place_notes = place(host, model, policy, cores, counts, kv_by_node)
    return instances, [*notes, *kv_notes, *place_notes], [*warnings, *kv_warnings, *place_warnings]


def machine_of(host: Host, model: Model, policy: Policy) -> Machine:
    """What the performance model takes of the host: the policy's bandwidth (calibrated,
    or the spec sheet's) and its cores' compute in the dtype served."""
    compute = performance.compute_of(host.flags, host.generation, model.dtype)
    return Machine(policy.core_bandwidth_gbs, compute, policy.bandwidth_source)


def layout_of(instances: tuple[Instance, ...] | list[Instance]) -> Layout:
    """The plan's instances as the performance model counts them: the smallest one's
    OpenMP cores (on each host of a pipeline, its ranks there together), each stage in turn."""
    return Layout(
        cores=min(len(i.omp_cpus) for i in instances),
        instances=len(instances),
        stages=max(i.pipeline_parallel_size for i in instances),
    )


def make_plan(host: Host, model: Model, policy: Policy | None = None) -> Plan:
    """Count, size and place the instances; every step's reasons in warnings and notes.
    A refusal names every way out, bfloat16 among them where float32 was the planner's
    own choice and doubled the weights."""
    policy = policy or Policy()
    try:
        return plan_for(host, model, policy)
    except PlanError as refusal:
        if not doubled(model, host, policy.dtype):
            raise
        try:
            half = plan_for(host, model, replace(policy, dtype="bfloat16"))
        except PlanError:
            raise refusal from None
        raise PlanError(f"{refusal}. {in_bfloat16(half)}") from None


def in_bfloat16(half: Plan) -> str:
    """The way out a refusal in float32 gives when the bfloat16 plan fits, at its cost."""
    kv = sorted({i.kv_cache_gib for i in half.instances})
    return (
        f"Or serve it in bfloat16 (--dtype bfloat16): it fits, {half.model.weight_gib:.1f} "
        f"GiB of weights and KV {'/'.join(map(str, kv))} GiB per instance, but this CPU "
        f"emulates bf16, {EMULATED_BF16_SLOWDOWN:g}x slower than float32 "
        f"({EMULATED_BF16_SOURCE})"
    )


def plan_for(host: Host, model: Model, policy: Policy) -> Plan:
    """make_plan's one attempt, in the dtype the policy gives or the CPU decides."""
    inactive = check_policy(host, policy)
    asked, limit = policy.max_model_len, model.context_limit
    if asked and limit and asked > limit:  # vLLM would refuse it at every start
        raise PlanError(
            f"max_model_len {asked} is over the {limit} tokens {model.name} takes "
            f"({model.context_source}): give {limit} or less, or 0 for the model's own"
        )
    quantization.check(model.quantization, host, model.name)
    served = serving_dtype(host, policy.dtype)
    stored, model = model, served_model(model, served.dtype)
    cores = usable_cores(host)
    if not cores:
        raise PlanError(
            "no usable CPUs: the cgroup cpuset allows none of the online CPUs; "
            "widen the container's --cpuset-cpus"
        )
    parts = parallel.split(host, model, policy, list(cores))
    if parts.tensor > 1 or parts.pipeline > 1:
        instances, notes, warnings = place_groups(host, model, policy, cores, parts)
    else:
        instances, notes, warnings = place_replicas(host, model, policy, cores)
    notes.append(dtype_note(served.why, stored, model))
    split = parts.tensor > 1 or parts.pipeline > 1
    notes += [w for w in [speculation.decide(policy.speculation, model.runner, split).why] if w]
    notes += quantization.note(model.quantization, policy.target)
    if model.runner == GENERATE and model.weight_bytes > 0 and instances:
        machine, shape = machine_of(host, model, policy), performance.shape_of(model)
        notes.append(prediction_note(machine, shape, layout_of(instances), policy.load))
    last_warnings, last_notes = final_checks(host, model, policy, instances)
    warnings = [*([inactive] if inactive else []), *warnings, *last_warnings]
    notes += last_notes
    return Plan(host, model, policy, tuple(instances), tuple(warnings), tuple(notes))
