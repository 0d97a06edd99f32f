"""What the operator asks of the planner, with the defaults' evidence, and its checks."""

from __future__ import annotations

from dataclasses import dataclass

from zenvllm.core.dtype import CHOICES as DTYPES
from zenvllm.core.errors import PlanError
from zenvllm.core.host import Host
from zenvllm.core.performance import Load, Slo, parse_load, parse_slo
from zenvllm.core.request import DEFAULT, LAYOUTS, Request
from zenvllm.core.targets import TARGETS, missing_isa


@dataclass(frozen=True)
class Policy:
    """The operator's options (core/request.py holds their defaults and help) and the
    planner's own figures, each with its evidence."""

    instances: int | None = DEFAULT.instances  # None: auto
    target: str = DEFAULT.target
    layout: str = DEFAULT.layout
    dtype: str = DEFAULT.dtype  # auto: what the CPU computes natively (core/dtype.py)
    tensor_parallel: int | None = None  # None: auto, whole copies while one fits a node
    hosts: int = DEFAULT.hosts  # hosts of this kind a copy may be cut over (pipeline stages)
    base_port: int = DEFAULT.base_port
    name_prefix: str = DEFAULT.deployment
    # Several models on one host: where this model's instances start, so one
    # deployment's instances are <deployment>-0, -1, ... across its models.
    first_index: int = 0
    # The image launcher and deployments set it, so zen or pace starts anywhere, loudly.
    allow_inactive: bool = DEFAULT.allow_inactive
    # Memory
    kv_fraction: float = DEFAULT.kv_fraction
    kv_cache_gib: int | None = None  # explicit size per instance, overrides the fraction
    min_kv_cache_gib: int = 1
    # The API server, engine core and worker processes beside the weights: measured
    # 2.2-2.35 GiB RSS while a 0.5 B model loaded (docs/explanation/planner.md).
    runtime_overhead_gib: float = 2.5
    os_reserve_gib: float = 1.0  # per node, plus os_reserve_fraction of the node
    os_reserve_fraction: float = 0.02
    shm_size_mib: int = 1024  # vLLM's message queues and OpenMP's registration files
    max_model_len: int | None = None  # None: the model's own
    speculation: str = DEFAULT.speculation  # core/speculation.py decides from it
    max_num_seqs: int = 256  # vLLM's scheduler default
    # What to size for (core/capacity.py); None: the bench's workload, for the notes only.
    load: Load | None = None
    slo: Slo | None = None
    # Cores
    max_cores_per_instance: int = 64
    tpot_target_ms: float = 50.0
    core_bandwidth_gbs: float = 4.0  # DRAM bandwidth per core, Zen 4: ~460 GB/s / 96 cores
    # Where core_bandwidth_gbs comes from, quoted in the plan's notes.
    bandwidth_source: str = (
        "a spec-sheet default (Zen 4: ~460 GB/s over 96 cores), not measured here; "
        "`zenvllm calibrate` measures this host"
    )
    # Without SMT a 1-core instance shares its core with its API server and scheduler: on
    # the 2-core test machine one 2-core instance made 1.42-1.61x two 1-core ones (0.5 B
    # bf16 and W8A8, 1.5 B); only a 26 M toy model, all Python overhead, went the other way.
    min_cores_without_smt: int = 2
    reserve_cpus: int = 1  # cores kept from OpenMP in big non-SMT slices, for the API server
    reserve_from_cores: int = 8  # smaller non-SMT slices give OpenMP every core

    @classmethod
    def of(cls, request: Request) -> Policy:
        """What the planner takes from a request (0 sizes and lengths: its own choice)."""
        return cls(
            instances=request.instances,
            target=request.target,
            layout=request.layout,
            dtype=request.dtype,
            tensor_parallel=request.tensor_parallel_size,
            hosts=request.hosts,
            base_port=request.base_port,
            name_prefix=request.deployment,
            allow_inactive=request.allow_inactive,
            kv_fraction=request.kv_fraction,
            kv_cache_gib=request.kv_cache_gib or None,
            max_model_len=request.max_model_len or None,
            speculation=request.speculation,
            load=parse_load(request.load) if request.load else None,
            slo=parse_slo(request.slo) if request.slo else None,
        )


def check_policy(host: Host, policy: Policy) -> str:
    """Refuse a policy the planner cannot follow; the inactive-target warning, or ""."""
    if policy.target not in TARGETS:
        raise PlanError(f"unknown target {policy.target!r}; choose one of {', '.join(TARGETS)}")
    if policy.dtype not in DTYPES:
        raise PlanError(f"unknown dtype {policy.dtype!r}; choose one of {', '.join(DTYPES)}")
    if policy.layout not in LAYOUTS:
        raise PlanError(f"unknown layout {policy.layout!r}; choose one of {', '.join(LAYOUTS)}")
    if policy.instances is not None and policy.instances < 1:
        raise PlanError(f"--instances {policy.instances}: give 1 or more, or auto")
    if policy.kv_cache_gib is not None and policy.kv_cache_gib < policy.min_kv_cache_gib:
        raise PlanError(
            f"--kv-cache-gib {policy.kv_cache_gib} is below the {policy.min_kv_cache_gib} GiB "
            "minimum; give at least that, or leave it out to let zenvllm size it"
        )
    if policy.hosts < 1:
        raise PlanError(f"--hosts {policy.hosts}: give 1 or more")
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
        f"({host.cpu_name}) lacks; it would run without its acceleration"
    )
