"""Synthetic hosts for planning a flavor before it boots.

`--flavor NAME` picks a preset; `--flavor vcpus=16,ram_gib=64,numa=2,smt=2,cpu=genoa`
describes any other. vCPUs split evenly over NUMA nodes, SMT siblings are
numbered like Linux does on EPYC (core c's sibling is c + cores), and L3 domains
follow each CPU family's CCX size.
"""

from __future__ import annotations

from dataclasses import dataclass

from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.core.host import GIB, Cpu, Host, Node

ZEN_COMMON = ("avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni")


@dataclass(frozen=True)
class CpuModel:
    vendor: str
    model_name: str
    flags: tuple[str, ...]
    l3_cores: int  # physical cores per L3 domain (CCX)
    family: int  # /proc/cpuinfo's cpu family and model of the part
    model: int


CPU_MODELS = {
    "milan": CpuModel("AuthenticAMD", "AMD EPYC 7763", ("avx2", "fma"), 8, 25, 1),
    "genoa": CpuModel("AuthenticAMD", "AMD EPYC 9454", (*ZEN_COMMON, "avx512_bf16"), 8, 25, 17),
    "turin": CpuModel(
        "AuthenticAMD", "AMD EPYC 9755", (*ZEN_COMMON, "avx512_bf16", "avx_vnni"), 8, 26, 2
    ),
    "sapphire-rapids": CpuModel(
        "GenuineIntel",
        "Intel Xeon Platinum 8480+",
        (*ZEN_COMMON, "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"),
        56,
        6,
        143,
    ),
}


@dataclass(frozen=True)
class Flavor:
    vcpus: int
    ram_gib: int
    numa: int = 1
    smt: int = 1  # threads per core
    cpu: str = "genoa"


PRESETS = {
    # The blog's Rackspace OpenStack Flex gp.5.24.96 VM.
    "epyc-9454-24c-96g": Flavor(vcpus=24, ram_gib=96, numa=1, smt=2, cpu="genoa"),
    # AMD's ZenDNN 5.2 reference systems (SMT off, 2 NUMA nodes per socket count as NPS).
    "epyc-9755-1s-128c-1536g": Flavor(vcpus=128, ram_gib=1536, numa=1, smt=1, cpu="turin"),
    "epyc-9755-1s-128c-1536g-smt": Flavor(vcpus=256, ram_gib=1536, numa=1, smt=2, cpu="turin"),
    "epyc-9755-2s-256c-3072g": Flavor(vcpus=256, ram_gib=3072, numa=2, smt=1, cpu="turin"),
    # A small Zen 3 VM: AVX2 only, so zen and pace do not apply.
    "epyc-7763-8c-32g": Flavor(vcpus=8, ram_gib=32, numa=1, smt=1, cpu="milan"),
}


# What a flavor's fields may be: Linux's most CPUs (NR_CPUS 8192), 1 PiB, its most nodes.
LIMITS = {"vcpus": (1, 8192), "ram_gib": (1, 1 << 20), "numa": (1, 1024), "smt": (1, 2)}
FLAVOR_FIX = "describe it as vcpus=N,ram_gib=N[,numa=N][,smt=1|2] (`openstack flavor show`)"


def parse_flavor(spec: str) -> Flavor:
    if spec in PRESETS:
        return PRESETS[spec]
    if "=" not in spec:
        raise UserError(
            f"unknown flavor {spec!r}; presets are {', '.join(PRESETS)}, or describe one as "
            "vcpus=N,ram_gib=N[,numa=N][,smt=1|2][,cpu=" + "|".join(CPU_MODELS) + "]"
        )
    fields = gate.fields(spec, ("vcpus", "ram_gib", "numa", "smt", "cpu"), FLAVOR_FIX)
    missing = [k for k in ("vcpus", "ram_gib") if k not in fields]
    if missing:
        raise UserError(f"flavor {spec!r} lacks {missing[0]}=N")

    def number(key: str, default: str) -> int:  # checked before anything is built from it
        low, high = LIMITS[key]
        return gate.whole_text(
            fields.get(key, default), f"flavor {spec[:80]!r}: {key}", low, high, FLAVOR_FIX
        )

    flavor = Flavor(
        vcpus=number("vcpus", ""),
        ram_gib=number("ram_gib", ""),
        numa=number("numa", "1"),
        smt=number("smt", "1"),
        cpu=fields.get("cpu", "genoa"),
    )
    check_flavor(flavor, spec)
    return flavor


def check_flavor(f: Flavor, spec: str) -> None:
    if f.cpu not in CPU_MODELS:
        raise UserError(f"flavor {spec!r}: cpu={f.cpu} unknown; one of {', '.join(CPU_MODELS)}")
    if f.vcpus < 1 or f.ram_gib < 1 or f.numa < 1 or f.smt not in (1, 2):
        raise UserError(f"flavor {spec!r}: vcpus, ram_gib, numa >= 1 and smt 1 or 2")
    if f.vcpus % (f.numa * f.smt):
        raise UserError(
            f"flavor {spec!r}: {f.vcpus} vCPUs do not split evenly into {f.numa} node(s) "
            f"of whole {f.smt}-thread cores"
        )


def synthetic_host(spec: str) -> Host:
    f = parse_flavor(spec)
    model = CPU_MODELS[f.cpu]
    cores = f.vcpus // f.smt
    cores_per_node = cores // f.numa
    cpus = []
    for thread in range(f.smt):
        for core in range(cores):
            node = core // cores_per_node
            l3_first = core - core % model.l3_cores
            l3_first = max(l3_first, node * cores_per_node)  # an L3 never spans nodes
            cpus.append(Cpu(id=thread * cores + core, core=core, package=0, node=node, l3=l3_first))
    cpus.sort(key=lambda c: c.id)
    node_mem = f.ram_gib * GIB // f.numa
    nodes = tuple(
        Node(
            id=n,
            cpus=tuple(c.id for c in cpus if c.node == n),
            mem_total_bytes=node_mem,
            mem_free_bytes=node_mem,
        )
        for n in range(f.numa)
    )
    return Host(
        cpus=tuple(cpus),
        nodes=nodes,
        allowed_cpus=frozenset(c.id for c in cpus),
        allowed_mems=frozenset(range(f.numa)),
        mem_total_bytes=f.ram_gib * GIB,
        mem_available_bytes=f.ram_gib * GIB,
        vendor=model.vendor,
        model_name=model.model_name,
        flags=frozenset(model.flags),
        source=f"flavor {spec}",
        family=model.family,
        cpu_model=model.model,
    )
