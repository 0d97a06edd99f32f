"""The bench's bandwidth figures: the planner's, and the roofline's.

The planner's layouts use this host's calibration file as `zenvllm plan` does (its
spec-sheet default without one), so `auto` is the layout a deployment here gets. The
roofline needs the real figure: a default of 4 GB/s per core against a VM that streams
13-16 made shares of 85-200%. So without a calibration file that describes this host,
the bench measures the bandwidth itself with `zenvllm calibrate`'s own code
(runtime/calibrate.py, a few seconds) and says so; it writes no file, so deployments
keep planning as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from zenvllm.bench.roofline import Bandwidth
from zenvllm.core import calibration, gate
from zenvllm.core.calibration import DEFAULT_PATH, Calibration
from zenvllm.core.errors import UserError
from zenvllm.core.host import Host
from zenvllm.core.model import Model
from zenvllm.core.plan import Policy
from zenvllm.core.topology import read_host
from zenvllm.runtime import calibrate

SECONDS = 2.0  # per measurement, calibrate's default: ~4 s on one node
SYS_CPU = Path("/sys/devices/system/cpu")
SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def l3_bytes(cpus: frozenset[int] | set[int], root: Path = SYS_CPU) -> int:
    """The L3 caches of `cpus` together (each shared cache once), from sysfs; 0 when
    sysfs does not say."""
    caches: dict[str, int] = {}

    def read(path: Path) -> str:
        try:
            return (gate.read_text(path, gate.SYSFS, "", optional=True) or "").strip()
        except gate.InputError:
            return ""

    for cpu in sorted(cpus):
        for index in sorted((root / f"cpu{cpu}" / "cache").glob("index*")):
            if read(index / "level") != "3":
                continue
            match = re.fullmatch(r"(\d+)([KMG]?)", read(index / "size"))
            if match:
                caches[read(index / "shared_cpu_list")] = int(match[1]) * SIZE_UNITS[match[2]]
    return sum(caches.values())


def slowest_node_cores(cal: Calibration) -> int:
    """The cores of the node whose per-core share Calibration.per_core_gbs is."""
    return min(cal.nodes.values(), key=lambda n: n.per_core_gbs).cores


def figures(
    host: Host,
    model: Model,
    measure: bool = True,
    measure_now: Callable[[Host, float], Calibration] = calibrate.calibrate,
) -> tuple[Policy, Bandwidth | None, list[str]]:
    """(the planner's policy, the roofline's bandwidth with the host's L3, notes).
    `measure`: False for a dry run, which measures nothing and says so."""
    policy, bandwidth, notes = bandwidth_of(host, model, measure, measure_now)
    if bandwidth is not None:
        bandwidth = replace(bandwidth, l3_bytes=l3_bytes(set(host.allowed_cpus)))
    return policy, bandwidth, notes


def bandwidth_of(
    host: Host,
    model: Model,
    measure: bool,
    measure_now: Callable[[Host, float], Calibration],
) -> tuple[Policy, Bandwidth | None, list[str]]:
    cal, path = calibrate.read(None, live=True)
    policy, ignored = calibration.apply(Policy(), cal, host, path, model)
    notes = [ignored or f"planner bandwidth: {policy.bandwidth_source}"]
    if cal is not None and not ignored:
        step = next((s for s in cal.steps if s.fits(model)), None)
        node_cores = step.cores if step else slowest_node_cores(cal)
        source = f"{policy.bandwidth_source} ({path})"
        bandwidth = Bandwidth(
            policy.core_bandwidth_gbs,
            cal.core_alone_gbs,
            node_cores,
            source,
            read_busy_gbs=round(cal.per_core_read_gbs, 2),
            read_alone_gbs=cal.read_alone_gbs,
        )
        return policy, bandwidth, notes
    why = (
        f"the calibration file {path} describes another host"
        if ignored
        else f"no calibration file at {DEFAULT_PATH}"
    )
    if not measure:
        notes.append(f"--dry-run: the roofline's bandwidth not measured ({why})")
        return policy, None, notes
    try:
        measured = measure_now(host, SECONDS)
    except UserError as err:
        notes.append(f"roofline: none; {why}, and measuring the bandwidth failed: {err}")
        return policy, None, notes
    busy, read = round(measured.per_core_gbs, 2), round(measured.per_core_read_gbs, 2)
    source = (
        f"measured by the bench at its start with zenvllm calibrate's code ({why}): "
        f"{busy:g} GB/s per core with every core busy, {measured.core_alone_gbs:g} GB/s "
        f"for one core alone, copying; {read:g} and {measured.read_alone_gbs:g} GB/s "
        f"reading ({measured.method})"
    )
    notes.append(
        f"roofline bandwidth: {source}; the planner's layouts keep their figure, as a "
        "deployment on this host would (`zenvllm calibrate` writes the file both use)"
    )
    cores = slowest_node_cores(measured)
    bandwidth = Bandwidth(
        busy,
        measured.core_alone_gbs,
        cores,
        source,
        measured_by_bench=True,
        read_busy_gbs=read,
        read_alone_gbs=measured.read_alone_gbs,
    )
    return policy, bandwidth, notes


def at_end(
    first: Bandwidth | None,
    measure_now: Callable[[Host, float], Calibration] = calibrate.calibrate,
) -> dict[str, float]:
    """The bench's own figures measured again after its last configuration, as at its
    start (meta's bandwidth_end_gbs, copying, and bandwidth_read_end_gbs, reading, which
    roofline.end_note sets beside the start's); nothing for a calibration file's figure
    (the operator's) or none."""
    if first is None or not first.measured_by_bench:
        return {}
    try:
        again = measure_now(read_host(), SECONDS)
    except UserError:
        return {}  # the run stands on its start's figure, as before this check
    ended = {"bandwidth_end_gbs": round(again.per_core_gbs, 2)}
    if first.read_busy_gbs and again.per_core_read_gbs:
        ended["bandwidth_read_end_gbs"] = round(again.per_core_read_gbs, 2)
    return ended


def run_figures(first: Bandwidth | None, ended: dict[str, float]) -> dict[str, float]:
    """The run's figures from its two measurements: the higher of each. Other work (a
    neighbour, the VM's host, the last run's containers going) can only take bandwidth
    from a measurement, never add to it, so the higher is the nearer to what the machine
    streams; a run whose start measured low (12.55 GB/s per core busy, 19.51 at the end,
    on a 2-core Zen 4 in CI) was otherwise predicted 27% under what it made. Where the
    end's is the higher, meta keeps the start's as bandwidth_start_gbs
    (bandwidth_read_start_gbs) and core_bandwidth_gbs (core_read_gbs) is the end's."""
    if first is None:
        return {}
    out: dict[str, float] = {}
    end = ended.get("bandwidth_end_gbs", 0.0)
    if end > first.core_busy_gbs:
        out |= {"bandwidth_start_gbs": first.core_busy_gbs, "core_bandwidth_gbs": end}
    read_end = ended.get("bandwidth_read_end_gbs", 0.0)
    if read_end > first.read_busy_gbs > 0:
        out |= {"bandwidth_read_start_gbs": first.read_busy_gbs, "core_read_gbs": read_end}
    return out
