"""Measured figures of a host, and how the planner uses them instead of spec-sheet ones.

`zenvllm calibrate` (runtime/calibrate.py) measures memory bandwidth on the real
host twice over, as a copy moves bytes (read and written: the figure the planner and
its performance model use, on which the model's constants were fitted) and as a decode
step reads them (read only: the roofline's, the ceiling a decode step can reach), and
with `--model` the weight read of that model's decode step, and writes
them to a JSON file; the planner reads it from `--calibration`, or
from DEFAULT_PATH when it plans the live host (never for a fixture or flavor).
Without a file the planner keeps the Policy default and says so. A file measured
on another CPU is ignored with a warning. Pure; standard library only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from zenvllm.core import gate
from zenvllm.core.host import Host
from zenvllm.core.model import Model
from zenvllm.core.policy import Policy
from zenvllm.core.topology import MAX_CPU_ID

DEFAULT_PATH = "/etc/zenvllm/calibration.json"
FORMAT = 1


@dataclass(frozen=True)
class NodeFigure:
    cores: int  # physical cores measured at once
    gbs: float  # their aggregate copy bandwidth, GB/s (bytes read + written)
    read_gbs: float = 0.0  # their aggregate read-only bandwidth, GB/s (0: not measured)

    @property
    def per_core_gbs(self) -> float:
        return self.gbs / self.cores

    @property
    def per_core_read_gbs(self) -> float:
        return self.read_gbs / self.cores


@dataclass(frozen=True)
class StepFigure:
    """A decode step's floor for one model: every weight byte read once, split over
    every core of a node reading at once (the step's other work is compute)."""

    model: str  # the directory's name, as the planner names the model
    weight_bytes: int
    cores: int
    ms: float  # the slowest core's time for its share

    @property
    def per_core_gbs(self) -> float:
        return self.weight_bytes / (self.ms / 1000) / self.cores / 1e9

    def fits(self, model: Model) -> bool:
        return (self.model, self.weight_bytes) == (model.name, model.weight_bytes)


@dataclass(frozen=True)
class Calibration:
    cpu_model: str
    cpus: int  # logical CPUs the measurement could use
    measured_at: str  # ISO 8601, UTC
    method: str
    core_alone_gbs: float  # one core with the node to itself
    nodes: dict[int, NodeFigure]  # every core of the node at once
    steps: tuple[StepFigure, ...] = ()  # the models measured with --model
    # Read only, as a decode step streams its weights; 0 in files of zenvllm before
    # 2026-12 (the roofline then falls back to the copy figures).
    read_alone_gbs: float = 0.0

    @property
    def per_core_gbs(self) -> float:
        """What each core gets when every instance decodes at once, on the slowest node:
        the figure the planner's cores-per-instance rule needs."""
        return min(n.per_core_gbs for n in self.nodes.values())

    @property
    def per_core_read_gbs(self) -> float:
        """What each core reads with every core of the slowest node reading; 0 when a
        node was not measured so."""
        return min(n.per_core_read_gbs for n in self.nodes.values())

    def to_json(self) -> str:
        d = asdict(self)
        if not self.read_alone_gbs:  # not measured read only: absent, as in older files
            del d["read_alone_gbs"]
            for node in d["nodes"].values():
                del node["read_gbs"]
        d["nodes"] = {str(k): v for k, v in d["nodes"].items()}
        d["steps"] = list(d["steps"])
        return json.dumps({"format": FORMAT, **d}, indent=2) + "\n"


MIN_GBS = 0.01  # per core: slower than any real memory, and still not 0 when rounded
MAX_GBS = 1e5


def parse(text: str, source: str) -> Calibration:
    """A calibration file's figures, or an InputError naming the file, the field and the fix."""
    fix = f"run `zenvllm calibrate --out {source}` again, or remove it"
    label = f"calibration file {source}"
    data = gate.obj(gate.parse_json(text, label, fix), label, fix)
    if data.get("format") != FORMAT:
        raise gate.InputError(f"{label}: not a zenvllm calibration (format {FORMAT}); {fix}")

    def field(d: dict[str, Any], key: str, where: str) -> object:
        if key not in d:
            raise gate.InputError(f"{label}: {where}{key} is missing; {fix}")
        return d[key]

    def whole(d: dict[str, Any], key: str, where: str = "", high: int = 1 << 20) -> int:
        return gate.whole(field(d, key, where), f"{label}: {where}{key}", 1, high, fix)

    def string(d: dict[str, Any], key: str, where: str = "") -> str:
        return gate.text(field(d, key, where), f"{label}: {where}{key}", fix)

    def gbs(d: dict[str, Any], key: str, where: str = "") -> float:
        return gate.number(field(d, key, where), f"{label}: {where}{key}", 0, MAX_GBS, fix)

    nodes = {}
    for key, value in gate.obj(field(data, "nodes", ""), f"{label}: nodes", fix).items():
        where = f"nodes.{key[:20]}."
        node_id = gate.whole_text(key, f"{label}: nodes key {key[:20]!r}", 0, MAX_CPU_ID, fix)
        node = gate.obj(value, f"{label}: {where[:-1]}", fix)
        read = gbs(node, "read_gbs", where) if "read_gbs" in node else 0.0
        nodes[node_id] = NodeFigure(whole(node, "cores", where), gbs(node, "gbs", where), read)
    steps = []
    for i, value in enumerate(gate.items(data.get("steps", []), f"{label}: steps", fix)):
        where = f"steps[{i}]."
        step = gate.obj(value, f"{label}: {where[:-1]}", fix)
        steps.append(
            StepFigure(
                string(step, "model", where),
                whole(step, "weight_bytes", where, 1 << 50),
                whole(step, "cores", where),
                gate.number(field(step, "ms", where), f"{label}: {where}ms", 0, 1e7, fix),
            )
        )
    if not nodes:
        raise gate.InputError(f"{label}: nodes is empty; at least one node is measured; {fix}")
    cal = Calibration(
        cpu_model=string(data, "cpu_model"),
        cpus=whole(data, "cpus"),
        measured_at=string(data, "measured_at"),
        method=string(data, "method"),
        core_alone_gbs=gbs(data, "core_alone_gbs"),
        nodes=nodes,
        steps=tuple(steps),
        read_alone_gbs=gbs(data, "read_alone_gbs") if "read_alone_gbs" in data else 0.0,
    )
    return consistent(cal, label, fix)


def consistent(cal: Calibration, label: str, fix: str) -> Calibration:
    """`cal` if its figures belong together: the read-only ones all or none, and none
    slower than any real memory."""
    read_figures = {cal.read_alone_gbs > 0, *(n.read_gbs > 0 for n in cal.nodes.values())}
    if len(read_figures) > 1:
        raise gate.InputError(
            f"{label}: read_alone_gbs and every node's read_gbs are measured together, "
            f"and only some of them are here; {fix}"
        )
    reading = [cal.read_alone_gbs, cal.per_core_read_gbs] if cal.read_alone_gbs else []
    steps = [s.per_core_gbs for s in cal.steps]
    slowest = min([cal.core_alone_gbs, cal.per_core_gbs, *reading, *steps])
    if slowest < MIN_GBS:
        raise gate.InputError(
            f"{label}: a figure of {slowest:.2g} GB/s per core is below {MIN_GBS} GB/s, "
            f"slower than any real memory; {fix}"
        )
    return cal


def mismatch(cal: Calibration, host: Host) -> str:
    """Why the figures do not describe this host; "" when they do."""
    here = host.cpu_name
    if cal.cpu_model != here:
        return f"it was measured on {cal.cpu_model}, this host is {here}"
    if cal.cpus != len(host.allowed_cpus):
        return f"it was measured over {cal.cpus} CPUs, {len(host.allowed_cpus)} are allowed here"
    return ""


def apply(
    policy: Policy, cal: Calibration | None, host: Host, source: str, model: Model | None = None
) -> tuple[Policy, str]:
    """The policy with the measured per-core bandwidth, and the warning if the file
    does not fit this host (then the default stays). A step measured on this very model
    is the better figure: it reads the real weights, in their real files and sizes (a
    model that fits a large L3 streams faster than any copy of 64 MiB buffers)."""
    if cal is None:
        return policy, ""
    why = mismatch(cal, host)
    if why:
        return policy, f"calibration {source} ignored: {why}; run `zenvllm calibrate` here"
    measured = (
        f"measured by zenvllm calibrate on {cal.measured_at[:10]}: {cal.per_core_gbs:.1f} GB/s "
        f"per core with every core busy, {cal.core_alone_gbs:.1f} GB/s for one core alone"
    )
    step = next((s for s in cal.steps if model is not None and s.fits(model)), None)
    if step is not None:
        measured = (
            f"measured by zenvllm calibrate on {cal.measured_at[:10]}: reading the "
            f"{step.weight_bytes / 1e9:.2f} GB of {step.model}'s weights once took "
            f"{step.ms:.1f} ms on {step.cores} core(s) at once, {step.per_core_gbs:.1f} GB/s "
            f"per core (copy bandwidth {cal.per_core_gbs:.1f} GB/s per core)"
        )
    gbs = step.per_core_gbs if step else cal.per_core_gbs
    return replace(policy, core_bandwidth_gbs=round(gbs, 2), bandwidth_source=measured), ""
