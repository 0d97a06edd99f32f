"""Measured figures of a host, and how the planner uses them instead of spec-sheet ones.

`zenvllm calibrate` (runtime/calibrate.py) measures memory bandwidth on the real
host and writes it to a JSON file; the planner reads it from `--calibration`, or
from DEFAULT_PATH when it plans the live host (never for a fixture or flavor).
Without a file the planner keeps the Policy default and says so. A file measured
on another CPU is ignored with a warning. Pure; standard library only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from zenvllm.core.errors import UserError
from zenvllm.core.host import Host
from zenvllm.core.policy import Policy

DEFAULT_PATH = "/etc/zenvllm/calibration.json"
FORMAT = 1


@dataclass(frozen=True)
class NodeFigure:
    cores: int  # physical cores measured at once
    gbs: float  # their aggregate copy bandwidth, GB/s (bytes read + written)

    @property
    def per_core_gbs(self) -> float:
        return self.gbs / self.cores


@dataclass(frozen=True)
class Calibration:
    cpu_model: str
    cpus: int  # logical CPUs the measurement could use
    measured_at: str  # ISO 8601, UTC
    method: str
    core_alone_gbs: float  # one core with the node to itself
    nodes: dict[int, NodeFigure]  # every core of the node at once

    @property
    def per_core_gbs(self) -> float:
        """What each core gets when every instance decodes at once, on the slowest node:
        the figure the planner's cores-per-instance rule needs."""
        return min(n.per_core_gbs for n in self.nodes.values())

    def to_json(self) -> str:
        d = asdict(self)
        d["nodes"] = {str(k): v for k, v in d["nodes"].items()}
        return json.dumps({"format": FORMAT, **d}, indent=2) + "\n"


def parse(text: str, source: str) -> Calibration:
    """A calibration file's figures, or a UserError naming the file and the fix."""
    fix = f"run `zenvllm calibrate --out {source}` again, or remove it"
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a zenvllm calibration (format {FORMAT})")
        nodes = {
            int(k): NodeFigure(int(v["cores"]), float(v["gbs"])) for k, v in data["nodes"].items()
        }
        cal = Calibration(
            cpu_model=str(data["cpu_model"]),
            cpus=int(data["cpus"]),
            measured_at=str(data["measured_at"]),
            method=str(data["method"]),
            core_alone_gbs=float(data["core_alone_gbs"]),
            nodes=nodes,
        )
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise UserError(f"calibration file {source}: {err!s}; {fix}") from None
    figures = [cal.core_alone_gbs, *(n.gbs for n in nodes.values())]
    if (
        not nodes
        or any(not 0 < f < 1e5 for f in figures)
        or any(n.cores < 1 for n in nodes.values())
    ):
        raise UserError(
            f"calibration file {source}: bandwidths must be between 0 and 100000 GB/s on at "
            f"least one node of at least one core; {fix}"
        )
    return cal


def mismatch(cal: Calibration, host: Host) -> str:
    """Why the figures do not describe this host; "" when they do."""
    here = host.model_name or "unknown CPU"
    if cal.cpu_model != here:
        return f"it was measured on {cal.cpu_model}, this host is {here}"
    if cal.cpus != len(host.allowed_cpus):
        return f"it was measured over {cal.cpus} CPUs, {len(host.allowed_cpus)} are allowed here"
    return ""


def apply(policy: Policy, cal: Calibration | None, host: Host, source: str) -> tuple[Policy, str]:
    """The policy with the measured per-core bandwidth, and the warning if the file
    does not fit this host (then the default stays)."""
    if cal is None:
        return policy, ""
    why = mismatch(cal, host)
    if why:
        return policy, f"calibration {source} ignored: {why}; run `zenvllm calibrate` here"
    measured = (
        f"measured by zenvllm calibrate on {cal.measured_at[:10]}: {cal.per_core_gbs:.1f} GB/s "
        f"per core with every core busy, {cal.core_alone_gbs:.1f} GB/s for one core alone"
    )
    return replace(
        policy, core_bandwidth_gbs=round(cal.per_core_gbs, 2), bandwidth_source=measured
    ), ""
