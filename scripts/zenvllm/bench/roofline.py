"""The roofline, pure: how much of its cores' memory bandwidth each configuration's
decode steps use, with the throughput workload and at batch 1 (one request in flight).

A decode step reads every weight once, so weight bytes per step over the time per
output token (TPOT) is the weight traffic an instance streamed. Its cores' bandwidth
comes from `zenvllm calibrate`'s figures (bench/bandwidth.py reads the file or measures
them), read only where they were measured so, as a decode step reads (a copy's figure,
read plus written, is lower: the 1.5 B shape's batch 1 read 106.7% of it), the copy's
for runs and files without them: with every instance busy each core gets its share of
its node with every core busy; at batch 1 only the first instance works, so its cores
have the node to themselves. Weights that fit in the host's L3 caches need not stream
from memory at all (the 0.2 M-parameter test model), so such configurations get no
roofline row. A
share above 100% is then physically impossible: it means the bandwidth figure is too
low, and is never printed as a number (bench/check.py reports it as a problem).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from zenvllm.bench.catalogue import GGUF_BYTES, PLANNER, SPLIT_KINDS
from zenvllm.bench.layouts import Configuration, Server, cpu_ids

# The goal: at batch 1 the planner's layout should stream at least 60% of its bandwidth.
BATCH1_GOAL = 60.0
OVER = "over 100%: the bandwidth figure is too low"
# How far the bench's own bandwidth figure may move between a run's start and its end
# before the table says the run's roofline and predictions are uncertain. The same
# 2-core Zen 5 VM measured 29.79 and 15.46 GB/s per core busy in two runs hours apart
# (docs/bench/qwen0.5b-rounds, -reversed): a figure is the machine's at that hour.
DRIFT_BOUND = 0.25


@dataclass(frozen=True)
class Bandwidth:
    """What a core streams, from `zenvllm calibrate`'s figures (GB/s): copying (read +
    written, the planner's and its performance model's) and reading only (the roofline's;
    0 where not measured)."""

    core_busy_gbs: float  # per core with every core of its node busy (the slowest node)
    core_alone_gbs: float  # one core with the node to itself
    node_cores: int  # the cores of that node
    source: str  # where the figures come from, in words
    measured_by_bench: bool = False  # no usable calibration file: the bench measured them
    l3_bytes: int = 0  # the host's L3 caches together (0: unknown)
    read_busy_gbs: float = 0.0  # reading only, per core with every core of its node busy
    read_alone_gbs: float = 0.0  # reading only, one core with the node to itself

    def meta(self) -> dict[str, Any]:
        """The result document's meta fields."""
        return {
            "core_bandwidth_gbs": self.core_busy_gbs,
            "core_alone_gbs": self.core_alone_gbs,
            "node_cores": self.node_cores,
            "bandwidth_source": self.source,
            "bandwidth_measured_by_bench": self.measured_by_bench,
            "l3_bytes": self.l3_bytes,
            "core_read_gbs": self.read_busy_gbs,
            "core_read_alone_gbs": self.read_alone_gbs,
        }


def ceiling(meta: dict[str, Any]) -> tuple[float, float, str]:
    """(per core busy, one core alone, which figure): the read-only figures a decode
    step is measured against, or the copy's where the run has none."""
    read, read_alone = meta.get("core_read_gbs") or 0.0, meta.get("core_read_alone_gbs") or 0.0
    if read > 0 and read_alone > 0:
        return read, read_alone, "read only"
    return meta.get("core_bandwidth_gbs") or 0.0, meta.get("core_alone_gbs") or 0.0, "copy"


def instance_cores(server: Server, host_cores: int) -> list[int]:
    """Physical cores of each instance (DP rank) of a server: its OpenMP list, one CPU
    per core; "auto" (stock) is every core of the host."""
    if server.omp_bind == "auto":
        return [host_cores]
    return [len(cpu_ids(rank)) for rank in server.omp_bind.split("|")]


def step_bytes(config: Configuration, weight_bytes: int) -> float:
    """Bytes a decode step of the configuration reads: its weights (a copy's own size),
    fewer for a GGUF type that packs them."""
    first = config.servers[0]
    return (first.weight_bytes or weight_bytes) * GGUF_BYTES.get(first.gguf, 1.0)


def batch1_bandwidth(cores: int, busy: float, alone: float, node_cores: int) -> float:
    """What an instance of `cores` cores can stream while no other instance works: each
    core at most what one core streams alone, all of them at most what their node
    streams with every core busy (an instance spanning whole nodes: their cores'
    every-core-busy share). An upper bound, so the share measured against it is a floor;
    for an instance that fills its node it is the throughput roofline's figure."""
    return min(cores * max(alone, busy), max(cores, node_cores) * busy)


def share(streamed: float, available: float) -> float:
    return round(100 * streamed / available, 1)


def roofline(
    summaries: list[Any],  # results.Summary
    configs: list[Configuration],
    meta: dict[str, Any],
) -> list[dict[str, Any]]:
    """Per configuration: the weight bytes per second each instance streamed against what
    its cores can stream, as a percentage; with the throughput workload (median TPOT,
    every instance busy: cores x the every-core-busy figure, the mean instance) and at
    batch 1 (batch-1 TPOT, the first instance alone: batch1_bandwidth)."""
    weight_bytes = meta.get("weight_bytes") or 0
    busy, alone, _ = ceiling(meta)
    node_cores = meta.get("node_cores") or 0
    host_cores = meta.get("host_cores") or 0
    l3_bytes = meta.get("l3_bytes") or 0
    by_name = {c.name: c for c in configs}
    rows = []
    for s in summaries:
        config = by_name[s.config]
        cores = [n for srv in config.servers for n in instance_cores(srv, host_cores)]
        if config.kind in SPLIT_KINDS:
            cores = [sum(cores)]  # one copy: each step reads its weights over every rank
        if not cores or s.tpot_ms <= 0 or weight_bytes <= 0 or busy <= 0:
            continue  # the gateway has no servers of its own
        step = step_bytes(config, weight_bytes)
        if step <= l3_bytes:
            continue  # its weights fit in the caches: nothing says they stream from memory
        streamed = step / (s.tpot_ms / 1000) / 1e9
        available = busy * statistics.mean(cores)
        row = {
            "config": s.config,
            "weight_gbs": round(streamed, 2),
            "bandwidth_gbs": round(available, 2),
            "percent": share(streamed, available),
            "batch1_weight_gbs": None,
            "batch1_bandwidth_gbs": None,
            "batch1_percent": None,
        }
        tpot1 = getattr(s, "batch1_tpot_ms", None)
        if tpot1 and tpot1 > 0 and alone > 0 and node_cores > 0:
            streamed1 = step / (tpot1 / 1000) / 1e9
            available1 = batch1_bandwidth(cores[0], busy, alone, node_cores)
            row["batch1_weight_gbs"] = round(streamed1, 2)
            row["batch1_bandwidth_gbs"] = round(available1, 2)
            row["batch1_percent"] = share(streamed1, available1)
        rows.append(row)
    return rows


def cached_note(meta: dict[str, Any]) -> str:
    """Why a run with a model and a bandwidth has no roofline rows; "" when it has them
    or that is not the reason."""
    weight_bytes, l3_bytes = meta.get("weight_bytes") or 0, meta.get("l3_bytes") or 0
    if not 0 < weight_bytes <= l3_bytes or not meta.get("core_bandwidth_gbs"):
        return ""
    return (
        f"Roofline: none; the model's {weight_bytes / 1e6:.1f} MB of weights fit in the "
        f"host's L3 caches ({l3_bytes / 1e6:.1f} MB), so its decode steps need not stream "
        "them from memory."
    )


def over(percent: float | None) -> bool:
    return percent is not None and percent > 100


def batch1_verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Does the planner's layout stream BATCH1_GOAL% of its bandwidth at batch 1? Unknown
    (None) when its batch 1 was not measured or the share is impossible; nothing when
    no configuration has a batch-1 share."""
    if not has_batch1(rows):
        return {}
    mine = next((r for r in rows if r["config"] == PLANNER), {})
    percent = mine.get("batch1_percent")
    return {
        "batch1_goal_percent": BATCH1_GOAL,
        "planner_batch1_percent": percent,
        "planner_batch1_goal_met": (
            None if percent is None or over(percent) else percent >= BATCH1_GOAL
        ),
    }


def percent_text(percent: float | None) -> str:
    if percent is None:
        return "n/a"
    return OVER if over(percent) else f"{percent:g}%"


def number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g}"


def roofline_row(r: dict[str, Any], batch1: bool) -> str:
    """One row of the roofline table (check.py looks for it in table.md)."""
    cells = [r["config"], number(r["weight_gbs"]), number(r["bandwidth_gbs"])]
    cells.append(percent_text(r["percent"]))
    if batch1:
        cells += [number(r.get("batch1_weight_gbs")), number(r.get("batch1_bandwidth_gbs"))]
        cells.append(percent_text(r.get("batch1_percent")))
    return "| " + " | ".join(cells) + " |"


def end_note(meta: dict[str, Any]) -> str:
    """The bench's own figures measured again at the run's end (bench/bandwidth.at_end),
    and how far they moved from the start's; the run's figure is the higher of the two
    (bench/bandwidth.run_figures). Beyond DRIFT_BOUND the roofline and predictions are
    uncertain by that much. Reported, not failed: a VM's figure moves with its host's
    load (the 2-core Zen 5's flipped between about 22 and 43 GB/s per core busy within
    minutes, one core alone 44 throughout)."""

    def started(figure: str, kept: str) -> Any:  # kept: where the start's was the lower
        return meta.get(kept) or meta.get(figure)

    pairs = [
        (
            "copying",
            started("core_bandwidth_gbs", "bandwidth_start_gbs"),
            meta.get("bandwidth_end_gbs"),
        ),
        (
            "reading",
            started("core_read_gbs", "bandwidth_read_start_gbs"),
            meta.get("bandwidth_read_end_gbs"),
        ),
    ]
    moves = [(what, end, end / start - 1) for what, start, end in pairs if start and end]
    if not moves:
        return "."
    if len(moves) == 1:  # runs from before the read-only figure: the copy's alone
        said = f"; measured again at the run's end: {moves[0][1]:g} GB/s ({moves[0][2]:+.0%})"
    else:
        figures = ", ".join(f"{what} {end:g} GB/s ({moved:+.0%})" for what, end, moved in moves)
        said = f"; measured again at the run's end: {figures}"
    if "bandwidth_start_gbs" in meta or "bandwidth_read_start_gbs" in meta:
        said += "; the run's figure is the higher of the two (other work only lowers one)"
    if max(abs(moved) for *_, moved in moves) > DRIFT_BOUND:
        said += (
            f", beyond ±{DRIFT_BOUND:.0%}: the machine changed during the run, so this "
            "roofline and the predictions are uncertain by that much"
        )
    return said + "."


def has_batch1(rows: list[dict[str, Any]]) -> bool:
    return any(r.get("batch1_percent") is not None for r in rows)


def roofline_table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """Weight bytes each instance streamed per second against its cores' bandwidth; the
    batch-1 columns when batch 1 was measured."""
    batch1 = has_batch1(rows)
    busy, alone, which = ceiling(meta)
    lines = [
        f"Roofline: weight bytes streamed per instance ({meta['weight_bytes'] / 1e9:.2f} GB "
        f"per decode step as stored, in the dtype each configuration serves / median TPOT) "
        f"against its cores x {busy:g} GB/s per core with every core busy, {which} "
        f"({meta.get('bandwidth_source') or 'unknown'})" + end_note(meta),
    ]
    if batch1:
        lines.append(
            f"Batch 1 (one request, the first instance; batch-1 TPOT): only that instance "
            f"works, so its cores do not share the memory with other instances: each counts "
            f"the one-core-alone figure ({alone:g} GB/s), together at most "
            f"what their node of {meta['node_cores']} cores streams with every core busy "
            f"({meta['node_cores'] * busy:g} GB/s); an upper bound, so "
            f"the batch-1 share is a floor (goal {BATCH1_GOAL:g}% for {PLANNER})."
        )
    head = "| configuration | weight GB/s per instance | bandwidth GB/s per instance | % |"
    rule = "|---|---:|---:|---:|"
    if batch1:
        head += " batch 1: weight GB/s | batch 1: bandwidth GB/s | batch 1: % |"
        rule += "---:|---:|---:|"
    lines += ["", head, rule, *(roofline_row(r, batch1) for r in rows)]
    return "\n".join(lines)
