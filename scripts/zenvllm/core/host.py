"""Plain data describing a host: what the planner decides from.

Built by `topology.read_host` (a real or fixture root) or `flavors.synthetic_host`
(an OpenStack flavor before it boots). No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zenvllm.core.generations import cpu_name, generation

GIB = 1024**3
MIB = 1024**2

# CPU flags that decide what each image target can do, as /proc/cpuinfo spells them.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


@dataclass(frozen=True)
class Cpu:
    """One online logical CPU."""

    id: int
    core: int  # host-unique physical core key: CPUs sharing it are SMT siblings
    package: int
    node: int  # NUMA node (0 where the host shows no NUMA)
    l3: int  # L3 domain key: the lowest CPU id sharing this CPU's L3


@dataclass(frozen=True)
class Node:
    """One NUMA node. A memory-only node has no CPUs."""

    id: int
    cpus: tuple[int, ...]
    mem_total_bytes: int
    mem_free_bytes: int


@dataclass(frozen=True)
class Host:
    cpus: tuple[Cpu, ...]  # online logical CPUs, sorted by id
    nodes: tuple[Node, ...]  # sorted by id
    allowed_cpus: frozenset[int]  # online CPUs the cgroup cpuset lets us use
    allowed_mems: frozenset[int]  # NUMA nodes the cgroup cpuset lets us use
    mem_total_bytes: int
    mem_available_bytes: int
    cgroup_mem_limit_bytes: int | None = None  # None: no limit
    vendor: str = ""
    model_name: str = ""
    flags: frozenset[str] = field(default_factory=frozenset)
    source: str = "/"  # where it was read from, or the flavor's name
    family: int | None = None  # /proc/cpuinfo's cpu family and model (None: not given)
    cpu_model: int | None = None

    def cpu(self, cpu_id: int) -> Cpu:
        return next(c for c in self.cpus if c.id == cpu_id)

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    @property
    def smt(self) -> bool:
        return len({c.core for c in self.cpus}) < len(self.cpus)

    @property
    def generation(self) -> str:
        """ "Zen 3", "Sapphire Rapids", ... ("" when unknown): what the brand string under
        KVM often leaves out."""
        return generation(self.vendor, self.family, self.cpu_model)

    @property
    def cpu_name(self) -> str:
        """The brand string with its generation, for plans, status and results."""
        return cpu_name(self.model_name, self.generation, self.family, self.cpu_model)

    @property
    def isa(self) -> frozenset[str]:
        return self.flags & frozenset(ISA_FLAGS)
