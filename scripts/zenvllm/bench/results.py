"""The benchmark's results, pure, for each model kind: `vllm bench serve`'s result files
read, the clients of one measurement folded into a run, runs into summaries. A
generating model's: output tokens, TTFT and TPOT, the throughput workload's and batch
1's. A pooling model's: inputs and tokens per second and request latency percentiles,
at each batch size. bench/document.py derives the rest (the verdict, the ratios, the
quotients) and puts them in the result document.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from zenvllm.bench.catalogue import STOCK
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.workloads import PERCENTILES

# -- a generating model's ----------------------------------------------------------

# The fields of vLLM's --save-result JSON this harness reads.
RESULT_KEYS = (
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "duration",
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
)


@dataclass(frozen=True)
class ClientResult:
    """One `vllm bench serve` result file."""

    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    duration_s: float
    mean_ttft_ms: float
    median_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    finished_at: float  # epoch seconds the file was written: the end of the measurement


def parse_client_result(data: dict[str, Any], source: str, finished_at: float) -> ClientResult:
    missing = [k for k in RESULT_KEYS if k not in data]
    if missing:
        raise ValueError(f"{source}: not a `vllm bench serve` result, missing {', '.join(missing)}")
    completed = int(data["completed"])
    failed = int(data.get("failed", len([e for e in data.get("errors", []) if e])))
    if completed < 1 or float(data["duration"]) <= 0:
        raise ValueError(f"{source}: no request completed (completed={completed})")
    return ClientResult(
        completed=completed,
        failed=failed,
        input_tokens=int(data["total_input_tokens"]),
        output_tokens=int(data["total_output_tokens"]),
        duration_s=float(data["duration"]),
        mean_ttft_ms=float(data["mean_ttft_ms"]),
        median_ttft_ms=float(data["median_ttft_ms"]),
        mean_tpot_ms=float(data["mean_tpot_ms"]),
        median_tpot_ms=float(data["median_tpot_ms"]),
        finished_at=finished_at,
    )


def counted_by_server(
    result: ClientResult, data: dict[str, Any], source: str, server_tokens: int, output_len: int
) -> ClientResult:
    """A client result whose output tokens the server counted (llama.cpp's Prometheus
    counter): `vllm bench serve` re-tokenizes the text of a server whose last stream
    chunk carries both text and usage, which miscounts random-weight output. Every
    request must have made exactly output_len tokens (--ignore-eos); TPOT is then each
    request's decode time (the sum of its inter-token gaps, from --save-detailed)
    over output_len - 1, as vLLM computes it."""
    expected = result.completed * output_len
    if server_tokens != expected:
        raise ValueError(
            f"{source}: the server generated {server_tokens} tokens for {result.completed} "
            f"requests of {output_len} (expected {expected})"
        )
    itls = data.get("itls")
    if not isinstance(itls, list) or len(itls) != result.completed or output_len < 2:
        raise ValueError(f"{source}: no per-request inter-token latencies (--save-detailed)")
    tpots = [1000 * sum(gaps) / (output_len - 1) for gaps in itls]
    return replace(
        result,
        output_tokens=server_tokens,
        mean_tpot_ms=statistics.mean(tpots),
        median_tpot_ms=statistics.median(tpots),
    )


@dataclass(frozen=True)
class Run:
    """One measured repeat of one configuration, every client folded in."""

    config: str
    repeat: int
    clients: int
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    window_s: float
    output_tok_s: float
    total_tok_s: float
    request_s: float
    mean_ttft_ms: float
    median_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    load_1m: float  # load average just before the repeat: how quiet the machine was
    memory_mib: int = 0  # its servers' memory after the repeat (docker stats; 0: none here)
    # Requests in flight, all clients together: the workload's, or 1 for a batch-1 run
    # (0: a document written before it was recorded).
    concurrency: int = 0


def weighted(values: list[float], weights: list[int]) -> float:
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


UNITS_MIB = {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024, "TiB": 2**20}


def memory_mib(stats: str) -> int:
    """`docker stats --format {{.MemUsage}}` lines ("1.2GiB / 4GiB") -> their total MiB."""
    total = 0.0
    for line in stats.splitlines():
        match = re.fullmatch(r"([\d.]+)\s*([KMGT]?i?B)", line.split("/")[0].strip())
        if not match or match[2] not in UNITS_MIB:
            raise ValueError(f"docker stats: {line!r} is not a memory usage")
        total += float(match[1]) * UNITS_MIB[match[2]]
    return round(total)


class Timed(Protocol):
    @property
    def finished_at(self) -> float: ...
    @property
    def duration_s(self) -> float: ...


def span_s(clients: Sequence[Timed]) -> float:
    """Seconds from the first client's start to the last one's end (start-up skew between
    the clients of a multi-instance layout counts against it, never for it), rounded
    before use, so every rate in the file is the quotient of numbers in the file."""
    start = min(c.finished_at - c.duration_s for c in clients)
    return round(max(c.finished_at for c in clients) - start, 4)


def combine(
    config: str,
    repeat: int,
    results: list[ClientResult],
    load_1m: float,
    memory_mib: int = 0,
    concurrency: int = 0,
) -> Run:
    """Clients of a multi-instance run -> one run. Throughput is all tokens over the span
    from the first client's start to the last one's end, so start-up skew between clients
    counts against the multi-instance layout, never for it. Latencies are the
    request-weighted means of each client's figure."""
    if not results:
        raise ValueError(f"{config} repeat {repeat}: no client results")
    window = span_s(results)
    out = sum(r.output_tokens for r in results)
    inp = sum(r.input_tokens for r in results)
    done = [r.completed for r in results]
    return Run(
        config=config,
        repeat=repeat,
        clients=len(results),
        completed=sum(done),
        failed=sum(r.failed for r in results),
        input_tokens=inp,
        output_tokens=out,
        window_s=window,
        output_tok_s=round(out / window, 2),
        total_tok_s=round((out + inp) / window, 2),
        request_s=round(sum(done) / window, 3),
        mean_ttft_ms=round(weighted([r.mean_ttft_ms for r in results], done), 2),
        median_ttft_ms=round(weighted([r.median_ttft_ms for r in results], done), 2),
        mean_tpot_ms=round(weighted([r.mean_tpot_ms for r in results], done), 3),
        median_tpot_ms=round(weighted([r.median_tpot_ms for r in results], done), 3),
        load_1m=round(load_1m, 2),
        memory_mib=memory_mib,
        concurrency=concurrency,
    )


@dataclass(frozen=True)
class Summary:
    """A configuration over its repeats: medians, and min/max as the spread."""

    config: str
    shape: str
    repeats: int
    output_tok_s: float
    output_min: float
    output_max: float
    total_tok_s: float
    ttft_ms: float
    ttft_min: float
    ttft_max: float
    tpot_ms: float
    tpot_min: float
    tpot_max: float
    ratio: float | None  # output_tok_s / stock's output_tok_s (both as written)
    memory_mib: int = 0  # the servers' memory, median over repeats
    # One request at a time to the first instance (medians over its batch-1 runs; None:
    # not measured): the latency an interactive user gets.
    batch1_ttft_ms: float | None = None
    batch1_tpot_ms: float | None = None
    batch1_output_tok_s: float | None = None
    # The ratio's spread over the repeats (bench/order.py; None: before runs recorded it).
    ratio_min: float | None = None
    ratio_max: float | None = None


def summarize(
    runs: list[Run], configs: list[Configuration], batch1: list[Run] | tuple[Run, ...] = ()
) -> list[Summary]:
    summaries = []
    for config in configs:
        mine = [r for r in runs if r.config == config.name]
        if not mine:
            continue
        one = [r for r in batch1 if r.config == config.name]
        out = [r.output_tok_s for r in mine]
        ttft = [r.median_ttft_ms for r in mine]
        tpot = [r.median_tpot_ms for r in mine]
        summaries.append(
            Summary(
                config=config.name,
                shape=config.shape,
                repeats=len(mine),
                output_tok_s=round(statistics.median(out), 1),
                output_min=round(min(out), 1),
                output_max=round(max(out), 1),
                total_tok_s=round(statistics.median(r.total_tok_s for r in mine), 1),
                ttft_ms=round(statistics.median(ttft), 2),
                ttft_min=round(min(ttft), 2),
                ttft_max=round(max(ttft), 2),
                tpot_ms=round(statistics.median(tpot), 3),
                tpot_min=round(min(tpot), 3),
                tpot_max=round(max(tpot), 3),
                ratio=None,
                memory_mib=int(statistics.median(r.memory_mib for r in mine)),
                batch1_ttft_ms=median((r.median_ttft_ms for r in one), 2),
                batch1_tpot_ms=median((r.median_tpot_ms for r in one), 3),
                batch1_output_tok_s=median((r.output_tok_s for r in one), 1),
            )
        )
    stock = next((s for s in summaries if s.config == STOCK), None)
    if stock is None or stock.output_tok_s <= 0:
        return summaries
    return [replace(s, ratio=round(s.output_tok_s / stock.output_tok_s, 3)) for s in summaries]


def median(values: Iterable[float], places: int) -> float | None:
    """The median, rounded as the summary rounds the same figure; None for no values."""
    values = list(values)
    return round(statistics.median(values), places) if values else None


# -- a pooling model's --------------------------------------------------------------

# What `vllm bench serve` writes for an embedding backend (with --save-detailed).
POOLING_KEYS = ("completed", "total_input_tokens", "total_input_sequences", "duration")


@dataclass(frozen=True)
class PoolingClient:
    """One `vllm bench serve` embedding result file."""

    completed: int  # requests
    failed: int
    inputs: int
    input_tokens: int  # as the server counted them (usage.prompt_tokens)
    duration_s: float
    latencies_ms: tuple[float, ...]  # each completed request's
    finished_at: float  # epoch seconds the file was written: the end of the measurement


def parse_pooling_result(
    data: dict[str, Any], source: str, finished_at: float, requests: int
) -> PoolingClient:
    """A result file of `requests` requests: what completed, their latencies. A request
    lost (an error, or none recorded) is a failure, never a shorter measurement."""
    missing = [k for k in POOLING_KEYS if k not in data]
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
    return PoolingClient(
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
class PoolingRun:
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


def combine_batch(
    config: str, batch: int, repeat: int, found: list[PoolingClient], load: float, concurrency: int
) -> PoolingRun:
    """All inputs and tokens over the span from the first client's start to the last
    one's end (span_s, as a generating model's run); latency percentiles over every
    request of every client. Rounded before the rates are divided, so each rate is the
    quotient of numbers in the file."""
    if not found:
        raise ValueError(f"{config} batch {batch} repeat {repeat}: no client results")
    window = span_s(found)
    inputs = sum(c.inputs for c in found)
    tokens = sum(c.input_tokens for c in found)
    done = sum(c.completed for c in found)
    latencies = [t for c in found for t in c.latencies_ms]
    p50, p90, p99 = (round(percentile(latencies, p), 2) for p in PERCENTILES)
    return PoolingRun(
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
class PoolingSummary:
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


def summarize_batches(runs: list[PoolingRun], configs: list[Configuration]) -> list[PoolingSummary]:
    """A row per configuration and batch size, configurations in their order."""
    rows = []
    for config in configs:
        for batch in sorted({r.batch for r in runs if r.config == config.name}):
            mine = [r for r in runs if r.config == config.name and r.batch == batch]
            rate = [r.inputs_s for r in mine]
            rows.append(
                PoolingSummary(
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
        replace(s, ratio=round(s.inputs_s / stock[s.batch], 3)) if stock.get(s.batch) else s
        for s in rows
    ]
