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
  then as many slices as fill the node. On the 2-core test machine, with the
  26 M-parameter bench model, two 1-core instances made 1.37-1.47x of vLLM's
  stock container, one 2-core instance 1.31-1.41x (README, Benchmarks).
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
* KV cache: what the node has left after the OS reserve and every instance's
  weights, runtime and shm, times `kv_fraction`, shared out; never more than
  the model can use (max_num_seqs x max_model_len tokens), never under
  `min_kv_cache_gib`, and within the cgroup memory limit.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from zenvllm.core import deployed
from zenvllm.core.container import Settings, container_of, placement
from zenvllm.core.errors import PlanError
from zenvllm.core.host import GIB, MIB, Host
from zenvllm.core.model import Model
from zenvllm.core.targets import TARGETS, missing_isa
from zenvllm.core.topology import format_cpu_list

LAYOUTS = ("contiguous", "interleaved")


@dataclass(frozen=True)
class Policy:
    instances: int | None = None  # None: auto
    target: str = "vllm-openai"
    layout: str = "contiguous"  # contiguous (L3-packed) or interleaved cores
    base_port: int = 8001
    name_prefix: str = "zenvllm"
    # Plan a target this CPU cannot accelerate (it serves as vllm-openai would); the
    # image launcher and deployments set it, so zen or pace starts anywhere, loudly.
    allow_inactive: bool = False
    # Memory
    kv_fraction: float = 0.9  # of what is left on the node once weights etc. are placed
    kv_cache_gib: int | None = None  # explicit size per instance, overrides the fraction
    min_kv_cache_gib: int = 1
    runtime_overhead_gib: float = 2.0  # torch + vLLM processes (measured ~2.2 GB RSS idle)
    os_reserve_gib: float = 1.0  # per node, plus os_reserve_fraction of the node
    os_reserve_fraction: float = 0.02
    shm_size_mib: int = 1024  # vLLM's message queues and OpenMP's registration files
    max_model_len: int | None = None  # None: the model's own
    max_num_seqs: int = 256  # vLLM's scheduler default
    # Cores
    max_cores_per_instance: int = 64
    tpot_target_ms: float = 50.0
    core_bandwidth_gbs: float = 4.0  # DRAM bandwidth per core, Zen 4: ~460 GB/s / 96 cores
    reserve_cpus: int = 1  # cores kept from OpenMP in big non-SMT slices, for the API server
    reserve_from_cores: int = 8  # smaller non-SMT slices give OpenMP every core


@dataclass(frozen=True)
class Instance:
    name: str
    port: int
    node: int
    cpus: tuple[int, ...]  # the container's cpuset
    omp_cpus: tuple[int, ...]  # OpenMP threads, one per physical core
    mems: tuple[int, ...]
    kv_cache_gib: int
    shm_size_mib: int
    memory_limit_mib: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def omp_threads_bind(self) -> str:
        return format_cpu_list(self.omp_cpus)

    @property
    def docker_args(self) -> list[str]:
        return placement(self)  # the container contract's, for the plan's JSON and bench

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            cpus=list(self.cpus),
            omp_cpus=list(self.omp_cpus),
            mems=list(self.mems),
            omp_threads_bind=self.omp_threads_bind,
            docker_args=self.docker_args,
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

    def to_dict(self, settings: Settings | None = None) -> dict:
        """The JSON contract; each instance carries its container under `settings`."""
        host = self.host
        settings = settings or Settings(deployment=self.policy.name_prefix)
        return {
            "host": {
                "source": host.source,
                "vendor": host.vendor,
                "model_name": host.model_name,
                "cpus": [c.id for c in host.cpus],
                "allowed_cpus": sorted(host.allowed_cpus),
                "smt": host.smt,
                "isa": sorted(host.isa),
                "mem_total_gib": round(host.mem_total_bytes / GIB, 2),
                "cgroup_mem_limit_gib": (
                    round(host.cgroup_mem_limit_bytes / GIB, 2)
                    if host.cgroup_mem_limit_bytes
                    else None
                ),
                "nodes": [
                    {
                        "id": n.id,
                        "cpus": list(n.cpus),
                        "mem_total_gib": round(n.mem_total_bytes / GIB, 2),
                    }
                    for n in host.nodes
                ],
            },
            "model": {
                "name": self.model.name,
                "weight_gib": round(self.model.weight_gib, 3),
                "kv_bytes_per_token": self.model.kv_bytes_per_token,
                "max_model_len": self.max_model_len,
            },
            "target": self.policy.target,
            "layout": self.policy.layout,
            "instances": [
                {**i.to_dict(), "container": container_of(i, settings).to_dict()}
                for i in self.instances
            ],
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }

    @property
    def max_model_len(self) -> int | None:
        return self.policy.max_model_len or self.model.max_model_len


# -- cores -------------------------------------------------------------------


def usable_cores(host: Host) -> dict[int, list[tuple[int, ...]]]:
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


def cores_per_instance(model: Model, policy: Policy) -> int:
    if model.weight_bytes <= 0:
        return policy.max_cores_per_instance
    per_core_step = policy.core_bandwidth_gbs * 1e9 * policy.tpot_target_ms / 1000
    return max(1, min(policy.max_cores_per_instance, math.ceil(model.weight_bytes / per_core_step)))


# -- memory ------------------------------------------------------------------


def node_budget(mem_total: int, policy: Policy) -> int:
    reserve = policy.os_reserve_gib * GIB + policy.os_reserve_fraction * mem_total
    return int(mem_total - reserve)


def fixed_cost(model: Model, policy: Policy) -> int:
    """What every instance costs before its KV cache."""
    return int(model.weight_bytes + policy.runtime_overhead_gib * GIB + policy.shm_size_mib * MIB)


def kv_need_gib(model: Model, policy: Policy, max_len: int | None) -> int | None:
    """The most KV cache the scheduler can fill: max_num_seqs sequences of max_len."""
    if not (model.kv_bytes_per_token and max_len):
        return None
    return math.ceil(policy.max_num_seqs * max_len * model.kv_bytes_per_token / GIB)


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# -- the plan ----------------------------------------------------------------


def check_policy(host: Host, policy: Policy) -> str:
    """Refuse a policy the planner cannot follow; the inactive-target warning, or ""."""
    if policy.target not in TARGETS:
        raise PlanError(f"unknown target {policy.target!r}; choose one of {', '.join(TARGETS)}")
    if policy.layout not in LAYOUTS:
        raise PlanError(f"unknown layout {policy.layout!r}; choose one of {', '.join(LAYOUTS)}")
    if policy.instances is not None and policy.instances < 1:
        raise PlanError(f"--instances {policy.instances}: give 1 or more, or auto")
    if policy.kv_cache_gib is not None and policy.kv_cache_gib < policy.min_kv_cache_gib:
        raise PlanError(
            f"--kv-cache-gib {policy.kv_cache_gib} is below the {policy.min_kv_cache_gib} GiB "
            "minimum; give at least that, or leave it out to let zenvllm size it"
        )
    if not 0 < policy.kv_fraction <= 1:
        raise PlanError(f"KV fraction {policy.kv_fraction} must be in (0, 1]")
    if not 1 <= policy.base_port <= 65535:
        raise PlanError(f"port {policy.base_port} is outside 1-65535")
    lacking = inactive_target(host, policy)
    if lacking and not policy.allow_inactive:
        raise PlanError(
            f"{lacking}. Use --target vllm-openai, a host with those features "
            "(AMD EPYC Zen 4 or newer), or --allow-inactive to serve it anyway"
        )
    return lacking


def inactive_target(host: Host, policy: Policy) -> str:
    """Why the target would not accelerate on this CPU; "" when it would."""
    lacking = missing_isa(TARGETS[policy.target], host)
    if not lacking:
        return ""
    return (
        f"target {policy.target} needs {', '.join(lacking)}, which this CPU "
        f"({host.model_name or 'unknown model'}) lacks; it would run without its acceleration"
    )


def instances_per_node(
    cores: dict[int, list[tuple[int, ...]]], policy: Policy, per_instance: int
) -> dict[int, int]:
    """Auto: as many slices of at least `per_instance` cores (and at most the cap) as fit
    each node. Explicit counts: spread over nodes by their core counts (largest remainder)."""
    total_cores = sum(len(c) for c in cores.values())
    n = policy.instances
    if n is None:
        cap = policy.max_cores_per_instance
        return {
            node: min(len(c), max(1, len(c) // per_instance, math.ceil(len(c) / cap)))
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
    by_remainder = sorted(shares, key=lambda node: (counts[node] - shares[node], node))
    for node in by_remainder[: n - sum(counts.values())]:
        counts[node] += 1
    return {node: min(k, len(cores[node])) for node, k in counts.items()}


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
    min_kv = policy.min_kv_cache_gib * GIB
    max_len = policy.max_model_len or model.max_model_len
    need = kv_need_gib(model, policy, max_len)
    kv_by_node: dict[int, int] = {}
    for node_id, k in counts.items():
        node = host.node(node_id)
        budget = node_budget(node.mem_total_bytes, policy)
        fit = budget // (fixed + min_kv)
        if fit < 1:
            raise PlanError(
                f"the model does not fit node {node_id}: one instance needs "
                f"{gib(fixed + min_kv)} (weights {gib(model.weight_bytes)}, runtime "
                f"{policy.runtime_overhead_gib:g} GiB, shm {policy.shm_size_mib} MiB, KV "
                f"{policy.min_kv_cache_gib} GiB minimum) but the node has {gib(budget)} "
                f"usable of {gib(node.mem_total_bytes)}. Use a smaller or quantized model, "
                "or a flavor with more memory per NUMA node"
            )
        if k > fit:
            if policy.instances is not None:
                at_most = sum(counts.values()) - k + fit
                raise PlanError(
                    f"{k} instances on node {node_id} need {gib(k * (fixed + min_kv))} but "
                    f"it has {gib(budget)} usable; use --instances {at_most} or fewer, "
                    "or a smaller model"
                )
            warnings.append(f"node {node_id}: memory fits {fit} instance(s), not {k}")
            counts[node_id] = k = fit
        if policy.kv_cache_gib is not None:
            kv = policy.kv_cache_gib
            if k * (fixed + kv * GIB) > budget:
                raise PlanError(
                    f"KV cache {kv} GiB x {k} instance(s) on node {node_id} needs "
                    f"{gib(k * (fixed + kv * GIB))} but the node has {gib(budget)} usable; "
                    f"lower --kv-cache-gib or use fewer instances"
                )
        else:
            kv = int((budget - k * fixed) * policy.kv_fraction / k // GIB)
            if need is not None and need < kv:
                kv = max(need, policy.min_kv_cache_gib)
        kv_by_node[node_id] = kv

    total = sum(counts.values())
    if host.cgroup_mem_limit_bytes:
        limit = host.cgroup_mem_limit_bytes
        room = int((limit * (1 - policy.os_reserve_fraction) - total * fixed) * policy.kv_fraction)
        cap = room // total // GIB if room > 0 else 0
        if cap < max(kv_by_node.values()):
            notes.append(f"KV capped at {cap} GiB by the cgroup memory limit {gib(limit)}")
            kv_by_node = {n: min(kv, cap) for n, kv in kv_by_node.items()}

    for node_id, kv in kv_by_node.items():
        if kv < policy.min_kv_cache_gib:
            where = (
                f"the cgroup memory limit {gib(host.cgroup_mem_limit_bytes)}"
                if host.cgroup_mem_limit_bytes
                else f"node {node_id}"
            )
            raise PlanError(
                f"KV cache would be {kv} GiB per instance, below the {policy.min_kv_cache_gib} GiB "
                f"minimum: {counts[node_id]} instance(s) of {gib(fixed)} each leave too little "
                f"of {where}. Use fewer instances, a smaller or quantized model, or a bigger flavor"
            )

    return counts, kv_by_node, warnings, notes


def instance_of(
    index: int,
    node_id: int,
    slice_cores: list[tuple[int, ...]],
    mems: tuple[int, ...],
    kv: int,
    fixed: int,
    policy: Policy,
) -> Instance:
    """One instance on its slice of cores: names, port, binding, sizes and env."""
    name = f"{policy.name_prefix}-{index}"
    cpus = tuple(sorted(c for ids in slice_cores for c in ids))
    omp = omp_cpus_of(slice_cores, policy)
    memory_mib = math.ceil((fixed + kv * GIB) / MIB)
    # What the container's launcher checks instead of planning again.
    promise = deployed.Promise(
        name,
        policy.target,
        format_cpu_list(cpus),
        format_cpu_list(mems),
        policy.shm_size_mib,
        memory_mib,
    )
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(kv),
        "VLLM_CPU_OMP_THREADS_BIND": format_cpu_list(omp),
        **TARGETS[policy.target].env,
        deployed.ENV_KEY: deployed.encode(promise),
    }
    return Instance(
        name=name,
        port=policy.base_port + index,
        node=node_id,
        cpus=cpus,
        omp_cpus=omp,
        mems=mems,
        kv_cache_gib=kv,
        shm_size_mib=policy.shm_size_mib,
        memory_limit_mib=memory_mib,
        env=env,
    )


def make_plan(host: Host, model: Model, policy: Policy | None = None) -> Plan:
    policy = policy or Policy()
    inactive = check_policy(host, policy)
    cores = usable_cores(host)
    if not cores:
        raise PlanError(
            "no usable CPUs: the cgroup cpuset allows none of the online CPUs; "
            "widen the container's --cpuset-cpus"
        )
    warnings: list[str] = [inactive] if inactive else []
    notes: list[str] = []
    fixed = fixed_cost(model, policy)
    per_instance = cores_per_instance(model, policy)
    counts = instances_per_node(cores, policy, per_instance)
    if policy.instances is None:
        notes.append(
            f"auto: {model.weight_gib:.2f} GiB of weights need {per_instance} core(s) per "
            f"instance to keep a decode step under {policy.tpot_target_ms:g} ms at "
            f"~{policy.core_bandwidth_gbs:g} GB/s per core (cap {policy.max_cores_per_instance})"
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
    counts, kv_by_node, kv_warnings, kv_notes = kv_cache_per_node(host, model, policy, counts)
    warnings += kv_warnings
    notes += kv_notes

    instances: list[Instance] = []
    for node_id, k in counts.items():
        kv = kv_by_node[node_id]
        mems = (node_id,) if node_id in host.allowed_mems else tuple(sorted(host.allowed_mems))
        if mems != (node_id,):
            warnings.append(f"node {node_id}'s memory is outside the cgroup; using nodes {mems}")
        for slice_cores in split_cores(cores[node_id], k, policy.layout):
            index = len(instances)
            instances.append(instance_of(index, node_id, slice_cores, mems, kv, fixed, policy))
        tokens = (
            f", room for {kv * GIB // model.kv_bytes_per_token:,} tokens"
            if model.kv_bytes_per_token
            else ""
        )
        notes.append(
            f"node {node_id}: {k} instance(s) over {len(cores[node_id])} core(s), "
            f"KV {kv} GiB each{tokens}"
        )

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
    footprint = sum(i.memory_limit_mib for i in instances) * MIB
    if footprint > host.mem_available_bytes:
        warnings.append(
            f"the plan needs {gib(footprint)} but only {gib(host.mem_available_bytes)} is "
            "available now; stop other workloads first"
        )
    return Plan(host, model, policy, tuple(instances), tuple(warnings), tuple(notes))
