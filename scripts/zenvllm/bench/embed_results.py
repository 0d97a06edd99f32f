"""The embedding bench's results, pure: vLLM's embedding result files read, the clients
of one measurement folded into a run, runs into a summary per configuration and batch
size, and the planner's layout over stock and over the peer as quotients; the result
document bench/embed_report.py writes and bench/embed_check.py derives again.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from zenvllm.bench.catalogue import PLANNER, STOCK
from zenvllm.bench.embed_configs import PEER
from zenvllm.bench.embed_workload import PERCENTILES
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.results import span_s

# What `vllm bench serve` writes for an embedding backend (with --save-detailed).
RESULT_KEYS = ("completed", "total_input_tokens", "total_input_sequences", "duration")


@dataclass(frozen=True)
class EmbedClient:
    """One `vllm bench serve` embedding result file."""

    completed: int  # requests
    failed: int
    inputs: int
    input_tokens: int  # as the server counted them (usage.prompt_tokens)
    duration_s: float
    latencies_ms: tuple[float, ...]  # each completed request's
    finished_at: float  # epoch seconds the file was written: the end of the measurement


def parse_result(
    data: dict[str, Any], source: str, finished_at: float, requests: int
) -> EmbedClient:
    """A result file of `requests` requests: what completed, their latencies. A request
    lost (an error, or none recorded) is a failure, never a shorter measurement."""
    missing = [k for k in RESULT_KEYS if k not in data]
    if missing:
        raise ValueError(
            f"{source}: not an embedding result of vllm bench, no {', '.join(missing)}"
        )
    completed = int(data["completed"])
    errors = data.get("errors") or [""] * len(data.get("latencies", []))
    latencies = data.get("latencies", [])
    if len(latencies) != len(errors):
        raise ValueError(f"{source}: {len(latencies)} latencies for {len(errors)} requests")
    done = [1000 * float(t) for t, e in zip(latencies, errors, strict=True) if not e]
    if completed < 1 or float(data["duration"]) <= 0 or len(done) != completed:
        raise ValueError(f"{source}: {completed} requests completed, {len(done)} latencies")
    return EmbedClient(
        completed=completed,
        failed=requests - completed,
        inputs=int(data["total_input_sequences"]),
        input_tokens=int(data["total_input_tokens"]),
        duration_s=float(data["duration"]),
        latencies_ms=tuple(done),
        finished_at=finished_at,
    )


def percentile(values: list[float] | tuple[float, ...], p: float) -> float:
    """numpy's default (linear) percentile, as vLLM's client computes its own."""
    ordered = sorted(values)
    at = (len(ordered) - 1) * p / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


@dataclass(frozen=True)
class EmbedRun:
    """One measured repeat of one configuration at one batch size, its clients folded."""

    config: str
    batch: int
    repeat: int
    clients: int
    requests: int  # completed
    failed: int
    inputs: int
    input_tokens: int
    window_s: float
    inputs_s: float
    tokens_s: float
    requests_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    load_1m: float  # the load average just before it: how quiet the machine was
    concurrency: int


def combine(
    config: str, batch: int, repeat: int, found: list[EmbedClient], load: float, concurrency: int
) -> EmbedRun:
    """All inputs and tokens over the span from the first client's start to the last
    one's end (skew between the clients of a multi-instance layout counts against it);
    latency percentiles over every request of every client. Rounded before the rates are
    divided, so each rate is the quotient of numbers in the file."""
    if not found:
        raise ValueError(f"{config} batch {batch} repeat {repeat}: no client results")
    window = span_s(found)
    inputs = sum(c.inputs for c in found)
    tokens = sum(c.input_tokens for c in found)
    done = sum(c.completed for c in found)
    latencies = [t for c in found for t in c.latencies_ms]
    p50, p90, p99 = (round(percentile(latencies, p), 2) for p in PERCENTILES)
    return EmbedRun(
        config=config,
        batch=batch,
        repeat=repeat,
        clients=len(found),
        requests=done,
        failed=sum(c.failed for c in found),
        inputs=inputs,
        input_tokens=tokens,
        window_s=window,
        inputs_s=round(inputs / window, 2),
        tokens_s=round(tokens / window, 1),
        requests_s=round(done / window, 3),
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        mean_ms=round(statistics.mean(latencies), 2),
        load_1m=round(load, 2),
        concurrency=concurrency,
    )


@dataclass(frozen=True)
class EmbedSummary:
    """A configuration at one batch size over its repeats: medians, min-max as spread."""

    config: str
    shape: str
    batch: int
    repeats: int
    inputs_s: float
    inputs_min: float
    inputs_max: float
    tokens_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    ratio: float | None  # inputs_s / stock's inputs_s at the same batch size (both as written)


def summarize(runs: list[EmbedRun], configs: list[Configuration]) -> list[EmbedSummary]:
    """A row per configuration and batch size, configurations in their order."""
    rows = []
    for config in configs:
        for batch in sorted({r.batch for r in runs if r.config == config.name}):
            mine = [r for r in runs if r.config == config.name and r.batch == batch]
            rate = [r.inputs_s for r in mine]
            rows.append(
                EmbedSummary(
                    config=config.name,
                    shape=config.shape,
                    batch=batch,
                    repeats=len(mine),
                    inputs_s=round(statistics.median(rate), 1),
                    inputs_min=round(min(rate), 1),
                    inputs_max=round(max(rate), 1),
                    tokens_s=round(statistics.median(r.tokens_s for r in mine), 1),
                    p50_ms=round(statistics.median(r.p50_ms for r in mine), 2),
                    p90_ms=round(statistics.median(r.p90_ms for r in mine), 2),
                    p99_ms=round(statistics.median(r.p99_ms for r in mine), 2),
                    ratio=None,
                )
            )
    stock = {s.batch: s.inputs_s for s in rows if s.config == STOCK}
    return [
        EmbedSummary(**{**asdict(s), "ratio": round(s.inputs_s / stock[s.batch], 3)})
        if stock.get(s.batch)
        else s
        for s in rows
    ]


def planner_over(summaries: list[EmbedSummary]) -> list[dict[str, Any]]:
    """The planner's layout over stock and over the peer at each batch size: inputs/s,
    p50 and p99 latency as quotients (planner / other: throughput above 1 and latency
    below 1 favour the planner)."""
    by = {(s.config, s.batch): s for s in summaries}
    rows = []
    for s in summaries:
        planner = by.get((PLANNER, s.batch))
        if s.config not in (STOCK, PEER) or planner is None:
            continue
        rows.append(
            {
                "batch": s.batch,
                "other": s.config,
                "inputs": round(planner.inputs_s / s.inputs_s, 3),
                "p50": round(planner.p50_ms / s.p50_ms, 3),
                "p99": round(planner.p99_ms / s.p99_ms, 3),
            }
        )
    return sorted(rows, key=lambda r: (r["other"] != STOCK, r["batch"]))


def best_per_batch(summaries: list[EmbedSummary]) -> dict[str, str]:
    """The configuration with the most inputs/s at each batch size."""
    batches = sorted({s.batch for s in summaries})
    return {
        str(b): max((s for s in summaries if s.batch == b), key=lambda s: s.inputs_s).config
        for b in batches
    }


def derived(configs: list[Configuration], runs: list[EmbedRun]) -> dict[str, Any]:
    """Everything the document derives from its runs."""
    summaries = summarize(runs, configs)
    return {
        "summary": [asdict(s) for s in summaries],
        "planner_over": planner_over(summaries),
        "best": best_per_batch(summaries),
    }
