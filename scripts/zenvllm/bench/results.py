"""The benchmark's results, pure: vLLM's result files read, clients and repeats folded
into runs and summaries (the throughput workload's and batch 1's), the verdict and the
ratios to stock, the peers and other weights (bench/document.py puts them in the result
document, bench/roofline.py adds the roofline).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from zenvllm.bench.catalogue import ACCEPTANCE_RATIO, NEAR_BEST, PEER_KINDS, PLANNER, STOCK
from zenvllm.bench.layouts import Configuration

# -- results -----------------------------------------------------------------

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


def verdict(summaries: list[Summary], configs: list[Configuration]) -> dict[str, Any]:
    """Does the planner's auto layout reach the acceptance ratio, and is it the best
    layout of its image the sweep found?"""
    by_name = {s.config: s for s in summaries}
    kinds = {c.name: c for c in configs}
    planner = by_name.get(PLANNER)
    same_image = (
        [
            s
            for s in summaries
            if kinds[s.config].kind == "plan" and kinds[s.config].target == kinds[PLANNER].target
        ]
        if planner
        else []
    )
    best = max(same_image, key=lambda s: s.output_tok_s, default=None)
    overall = max(summaries, key=lambda s: s.output_tok_s, default=None)
    rival = best_rival(summaries, configs)
    near = round(planner.output_tok_s / rival.output_tok_s, 3) if planner and rival else None
    return {
        "planner": PLANNER,
        "planner_ratio": planner.ratio if planner else None,
        "acceptance_ratio": ACCEPTANCE_RATIO,
        "meets_acceptance": bool(planner and planner.ratio and planner.ratio >= ACCEPTANCE_RATIO),
        "best_layout": best.config if best else None,
        "planner_is_best_layout": bool(best and planner and best.config == PLANNER),
        "best_overall": overall.config if overall else None,
        "best_same_weights": rival.config if rival else None,
        "planner_vs_best": near,
        "near_best_ratio": NEAR_BEST,
        "near_best": bool(near and near >= NEAR_BEST),
    }


def same_weights(config: Configuration) -> bool:
    """Serves the bf16 weights through the planner's image or as a peer: the field the
    planner's layout must lead. Other images' layouts (zen) and quantized peers
    (llama.cpp's Q8_0 reads half the bytes) are measured beside it, not ranked with it."""
    quantized = any((s.gguf and s.gguf != "bf16") or s.model_dir for s in config.servers)
    return not quantized and (config.kind in PEER_KINDS or config.target == "vllm-openai")


def best_rival(summaries: list[Summary], configs: list[Configuration]) -> Summary | None:
    kinds = {c.name: c for c in configs}
    field = [s for s in summaries if same_weights(kinds[s.config])]
    return max(field, key=lambda s: s.output_tok_s, default=None)


def quotients(top: Summary, bottom: Summary) -> dict[str, float]:
    """Throughput, TTFT and TPOT of one summary row over another's."""
    return {
        "output": round(top.output_tok_s / bottom.output_tok_s, 3),
        "ttft": round(top.ttft_ms / bottom.ttft_ms, 3),
        "tpot": round(top.tpot_ms / bottom.tpot_ms, 3),
    }


def peer_ratios(summaries: list[Summary], configs: list[Configuration]) -> list[dict[str, Any]]:
    """The planner's layout against each peer: throughput, TTFT and TPOT as quotients
    (planner / peer: above 1 is better for throughput, below 1 for latencies)."""
    kinds = {c.name: c for c in configs}
    planner = next((s for s in summaries if s.config == PLANNER), None)
    if planner is None:
        return []
    return [
        {"peer": s.config, **quotients(planner, s)}
        for s in summaries
        if kinds[s.config].kind in PEER_KINDS or s.config == STOCK
    ]


def weight_ratios(summaries: list[Summary], configs: list[Configuration]) -> list[dict[str, Any]]:
    """Each other copy of the weights (auto-<name>) against the planner's layout on
    --model's: throughput, TTFT, TPOT and memory as quotients (copy / bf16)."""
    copies = {c.name for c in configs if any(s.model_dir for s in c.servers)}
    planner = next((s for s in summaries if s.config == PLANNER), None)
    if planner is None:
        return []
    return [
        {
            "weights": s.config,
            **quotients(s, planner),
            "memory": round(s.memory_mib / planner.memory_mib, 3) if planner.memory_mib else None,
        }
        for s in summaries
        if s.config in copies and s.output_tok_s > 0
    ]
