"""Read a host's CPU, NUMA, memory and cgroup topology from a root directory.

`read_host(root)` reads `root/sys` and `root/proc` the way the kernel lays them
out, so tests point it at fixture trees and a container reads its own view.
Everything below the reader is a pure parser over file text. Standard library
only: this runs on bare hosts and inside the image.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.core.host import Cpu, Host, Node

KIB = 1024
# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with
# 4 KiB pages); anything this large is no limit in practice.
UNLIMITED_THRESHOLD = 1 << 62
MAX_CPU_ID = 8191  # Linux's largest NR_CPUS (x86 MAXSMP); node ids are fewer still
FIX = "is this a copy of a real sysfs/procfs tree? pass --root one (e.g. a fixture tree)"

# ---------------------------------------------------------------- pure parsers


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse the kernel's list format ("0-3,8,10-11") into sorted, unique ids.

    An empty string (a CPU-less node, an empty offline list) is no CPUs. Ids are
    checked against MAX_CPU_ID before a range is expanded.
    """
    ids: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        bounds = (lo, hi) if sep else (lo,)
        if not all(b.isascii() and b.isdigit() for b in bounds):
            raise ValueError(f"bad CPU list {text.strip()[:60]!r}: cannot parse {part[:40]!r}")
        start, stop = (int(b) if len(b) <= 6 else MAX_CPU_ID + 1 for b in (lo, hi or lo))
        if stop < start or stop > MAX_CPU_ID:
            raise ValueError(
                f"bad CPU list {text.strip()[:60]!r}: {part!r} is not a range of ids "
                f"from 0 to {MAX_CPU_ID} (Linux's most)"
            )
        ids.update(range(start, stop + 1))
    return tuple(sorted(ids))


def format_cpu_list(ids: Iterable[int]) -> str:
    """The kernel's list format for ids: runs of consecutive ids become "a-b"."""
    ordered = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


_MEMINFO_LINE = re.compile(r"^(?:Node \d+ )?([A-Za-z0-9_()]+):\s+(\d{1,20})(?:\s+kB)?\s*$")


def parse_meminfo(text: str) -> dict[str, int]:
    """Parse /proc/meminfo or a node's meminfo into bytes (kB fields) or counts.

    Node files prefix each line with "Node N "; the prefix is dropped.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _MEMINFO_LINE.match(line.strip())
        if m:
            value = int(m.group(2))
            out[m.group(1)] = value * KIB if line.rstrip().endswith("kB") else value
    return out


@dataclass(frozen=True)
class CpuInfo:
    vendor: str
    model_name: str
    flags: frozenset[str]
    family: int | None = None
    model: int | None = None


def small_int(text: str | None) -> int | None:
    """A cpuinfo number (family, model): a few digits, else None."""
    return int(text) if text and text.isascii() and text.isdigit() and len(text) <= 6 else None


def parse_cpuinfo(text: str) -> CpuInfo:
    """Vendor, model name and flags of the first processor in /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # end of the first processor's block
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return CpuInfo(
        vendor=fields.get("vendor_id", ""),
        model_name=fields.get("model name", ""),
        flags=frozenset(fields.get("flags", "").split()),
        family=small_int(fields.get("cpu family")),
        model=small_int(fields.get("model")),
    )


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map each controller of /proc/self/cgroup to its path; "" keys the v2 line."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
        for name in controllers.split(","):
            if name:
                out[name] = path
    return out


def parse_memory_limit(text: str) -> int | None:
    """A cgroup memory limit in bytes; "max" (v2) or the v1 huge value is None."""
    value = text.strip()
    if not value or value == "max":
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 20):
        raise ValueError(value)
    limit = int(value)  # 0 is a limit: nothing may be charged
    return None if limit >= UNLIMITED_THRESHOLD else limit


# ---------------------------------------------------------------- the reader


def _read(path: Path, cap: int = gate.SYSFS) -> str | None:
    """An attribute's text; None when the kernel (or the copy) lacks it."""
    return gate.read_text(path, cap, FIX, optional=True)


def _read_list(path: Path) -> tuple[int, ...] | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return parse_cpu_list(text)
    except ValueError as err:
        raise gate.InputError(f"{path}: {err}; {FIX}") from None


def _read_int(path: Path, default: int) -> int:
    text = (_read(path) or "").strip()
    if not text:
        return default
    return gate.whole_text(text, str(path), -1, 1 << 31, FIX)  # some VMs say -1


def _meminfo(path: Path) -> dict[str, int]:
    return parse_meminfo(_read(path, gate.PROCFS) or "")


def _numbered(directory: Path, prefix: str) -> list[int]:
    pattern = re.compile(rf"^{prefix}(\d{{1,4}})$")
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := pattern.match(p.name)))


def _online_cpus(cpu_dir: Path) -> tuple[int, ...]:
    for name in ("online", "present"):
        ids = _read_list(cpu_dir / name)
        if ids:
            return ids
    # Old or trimmed sysfs: every cpuN directory whose online flag is not 0.
    return tuple(
        n
        for n in _numbered(cpu_dir, "cpu")
        if (_read(cpu_dir / f"cpu{n}" / "online") or "1")[0] != "0"
    )


def _cpu_topology(cpu_dir: Path, online: tuple[int, ...]) -> dict[int, tuple[int, int, int]]:
    """For each online CPU: (core key, package, L3 key).

    Core key: the lowest online CPU among its SMT siblings (thread_siblings_list),
    else the lowest CPU with the same (package, core_id): core_id alone repeats
    across packages. L3 key: the lowest CPU sharing its L3; the package when the
    cache is not described (some VMs).
    """
    online_set = set(online)
    raw: dict[int, tuple[int, int, tuple[int, ...] | None, tuple[int, ...] | None]] = {}
    for cpu in online:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        package = _read_int(topo / "physical_package_id", 0)
        core_id = _read_int(topo / "core_id", cpu)
        siblings = _read_list(topo / "thread_siblings_list")
        l3 = _read_list(cpu_dir / f"cpu{cpu}" / "cache" / "index3" / "shared_cpu_list")
        raw[cpu] = (package, core_id, siblings, l3)

    first_of_core: dict[tuple[int, int], int] = {}
    first_of_package: dict[int, int] = {}
    for cpu in online:
        package, core_id = raw[cpu][0], raw[cpu][1]
        first_of_core.setdefault((package, core_id), cpu)
        first_of_package.setdefault(package, cpu)

    out: dict[int, tuple[int, int, int]] = {}
    for cpu in online:
        package, core_id, siblings, l3 = raw[cpu]
        live_siblings = [s for s in siblings or () if s in online_set]
        core = min(live_siblings) if live_siblings else first_of_core[(package, core_id)]
        live_l3 = [s for s in l3 or () if s in online_set]
        l3_key = min(live_l3) if live_l3 else first_of_package[package]
        out[cpu] = (core, package, l3_key)
    return out


def _proc_meminfo(root: Path) -> dict[str, int]:
    return _meminfo(root / "proc" / "meminfo")


def node_mem_totals(root: Path) -> dict[int, int]:
    """MemTotal bytes per node as the node sysfs states it, before any reconciliation."""
    node_dir = root / "sys" / "devices" / "system" / "node"
    return {
        n: _meminfo(node_dir / f"node{n}" / "meminfo").get("MemTotal", 0)
        for n in _numbered(node_dir, "node")
    }


def _nodes(root: Path, online: tuple[int, ...], meminfo: dict[str, int]) -> tuple[Node, ...]:
    node_dir = root / "sys" / "devices" / "system" / "node"
    ids = _numbered(node_dir, "node")
    total = meminfo.get("MemTotal", 0)
    free = meminfo.get("MemFree", meminfo.get("MemAvailable", 0))
    if not ids:
        # Kernel without NUMA sysfs: one node holding everything.
        return (Node(id=0, cpus=online, mem_total_bytes=total, mem_free_bytes=free),)
    online_set = set(online)
    nodes = []
    for n in ids:
        cpus = tuple(
            c for c in _read_list(node_dir / f"node{n}" / "cpulist") or () if c in online_set
        )
        node_mem = _meminfo(node_dir / f"node{n}" / "meminfo")
        nodes.append(
            Node(
                id=n,
                cpus=cpus,
                mem_total_bytes=node_mem.get("MemTotal", 0),
                mem_free_bytes=node_mem.get("MemFree", 0),
            )
        )
    with_memory = [n for n in nodes if n.mem_total_bytes > 0]
    if len(with_memory) == 1 and total > with_memory[0].mem_total_bytes:
        # All memory belongs to the only memory node, yet some VMs' kernels
        # (Firecracker, seen on the test machine: node0 4 GiB, /proc 24 GiB)
        # count only part of it per node. /proc/meminfo is what can be allocated.
        only = with_memory[0]
        fixed = Node(only.id, only.cpus, total, max(only.mem_free_bytes, free))
        nodes = [fixed if n.id == only.id else n for n in nodes]
    return tuple(nodes)


@dataclass(frozen=True)
class CgroupLimits:
    cpus: tuple[int, ...] | None = None  # None: no cpuset restriction found
    mems: tuple[int, ...] | None = None
    memory_bytes: int | None = None
    version: int | None = None  # 1, 2 or None when no cgroup fs is visible


def _candidates(mount: Path, path: str) -> list[Path]:
    """The cgroup directory for `path` under `mount`, then its ancestors up to the mount.

    In a container the path in /proc/self/cgroup often does not exist under the
    mount (the mount is already the container's own cgroup): then only the
    mount root applies.
    """
    rel = path.strip("/")
    leaf = mount / rel if rel else mount
    if not leaf.is_dir():
        return [mount]
    chain = [leaf]
    while chain[-1] != mount:
        chain.append(chain[-1].parent)
    return chain


def _min_limit(paths: list[Path], filename: str) -> int | None:
    """The tightest limit along the chain: a parent's limit binds its children too."""
    limits = []
    for p in paths:
        text = _read(p / filename)
        if text is None:
            continue
        try:
            limit = parse_memory_limit(text)
        except ValueError:
            raise gate.InputError(
                f"{p / filename}: expected bytes (up to 20 digits) or 'max', found "
                f"{text.strip()[:40]!r}; {FIX}"
            ) from None
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def _first_list(paths: list[Path], filename: str) -> tuple[int, ...] | None:
    for p in paths:
        ids = _read_list(p / filename)
        if ids:
            return ids
    return None


def read_cgroup(root: Path) -> CgroupLimits:
    cg_root = root / "sys" / "fs" / "cgroup"
    paths = parse_proc_cgroup(_read(root / "proc" / "self" / "cgroup") or "")
    if (cg_root / "cgroup.controllers").exists():  # unified (v2-only) hierarchy
        chain = _candidates(cg_root, paths.get("", "/"))
        return CgroupLimits(
            cpus=_first_list(chain, "cpuset.cpus.effective"),
            mems=_first_list(chain, "cpuset.mems.effective"),
            memory_bytes=_min_limit(chain, "memory.max"),
            version=2,
        )
    if (cg_root / "cpuset").is_dir() or (cg_root / "memory").is_dir():  # v1 or hybrid
        cpuset = _candidates(cg_root / "cpuset", paths.get("cpuset", "/"))
        memory = _candidates(cg_root / "memory", paths.get("memory", "/"))
        return CgroupLimits(
            cpus=_first_list(cpuset, "cpuset.cpus"),
            mems=_first_list(cpuset, "cpuset.mems"),
            memory_bytes=_min_limit(memory, "memory.limit_in_bytes"),
            version=1,
        )
    return CgroupLimits()


def read_host(root: Path = Path("/")) -> Host:
    """Read the host (or container, or fixture tree) rooted at `root`."""
    root = Path(root)
    cpu_dir = root / "sys" / "devices" / "system" / "cpu"
    if not cpu_dir.is_dir():
        raise UserError(
            f"{cpu_dir} does not exist: not a Linux root with sysfs; "
            "pass --root a directory containing sys/ and proc/ (e.g. a fixture tree)"
        )
    online = _online_cpus(cpu_dir)
    if not online:
        raise UserError(f"no online CPUs found under {cpu_dir}: check {cpu_dir / 'online'}")
    meminfo = _proc_meminfo(root)
    nodes = _nodes(root, online, meminfo)
    node_of = {cpu: node.id for node in nodes for cpu in node.cpus}
    topo = _cpu_topology(cpu_dir, online)
    cpus = tuple(
        Cpu(id=c, core=topo[c][0], package=topo[c][1], node=node_of.get(c, 0), l3=topo[c][2])
        for c in online
    )
    cgroup = read_cgroup(root)
    allowed_cpus = (
        frozenset(online) if cgroup.cpus is None else frozenset(online) & set(cgroup.cpus)
    )
    if root.resolve() == Path("/") and hasattr(os, "sched_getaffinity"):
        # The live process may be narrower than its cgroup says (taskset, a parent
        # cgroup the container cannot see, a cpuset controller not delegated).
        narrower = allowed_cpus & os.sched_getaffinity(0)
        allowed_cpus = narrower or allowed_cpus
    node_ids = {n.id for n in nodes}
    allowed_mems = (
        frozenset(node_ids) if cgroup.mems is None else frozenset(node_ids) & set(cgroup.mems)
    )
    info = parse_cpuinfo(_read(root / "proc" / "cpuinfo", gate.PROCFS) or "")
    total = meminfo.get("MemTotal") or sum(n.mem_total_bytes for n in nodes)
    available = meminfo.get("MemAvailable", meminfo.get("MemFree", total))
    return Host(
        cpus=cpus,
        nodes=nodes,
        allowed_cpus=allowed_cpus,
        allowed_mems=allowed_mems,
        mem_total_bytes=total,
        mem_available_bytes=available,
        cgroup_mem_limit_bytes=cgroup.memory_bytes,
        vendor=info.vendor,
        model_name=info.model_name,
        flags=info.flags,
        source=str(root),
        family=info.family,
        cpu_model=info.model,
    )
