"""The benchmark's results, pure: vLLM's result files read, clients and repeats folded
into runs and summaries, the verdict, and the result document that `bench_report`
writes and `bench_check` checks.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass, replace

from zenvllm.bench.layouts import (
    ACCEPTANCE_RATIO,
    GGUF_BYTES,
    NEAR_BEST,
    PEER_KINDS,
    PLANNER,
    STOCK,
    Configuration,
    Server,
    cpu_ids,
)

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


def parse_client_result(data: dict, source: str, finished_at: float) -> ClientResult:
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
    result: ClientResult, data: dict, source: str, server_tokens: int, output_len: int
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


def combine(
    config: str, repeat: int, results: list[ClientResult], load_1m: float, memory_mib: int = 0
) -> Run:
    """Clients of a multi-instance run -> one run. Throughput is all tokens over the span
    from the first client's start to the last one's end, so start-up skew between clients
    counts against the multi-instance layout, never for it. Latencies are the
    request-weighted means of each client's figure."""
    if not results:
        raise ValueError(f"{config} repeat {repeat}: no client results")
    start = min(r.finished_at - r.duration_s for r in results)
    # Rounded before use, so every rate in the file is the quotient of numbers in the file.
    window = round(max(r.finished_at for r in results) - start, 4)
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


def summarize(runs: list[Run], configs: list[Configuration]) -> list[Summary]:
    summaries = []
    for config in configs:
        mine = [r for r in runs if r.config == config.name]
        if not mine:
            continue
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
            )
        )
    stock = next((s for s in summaries if s.config == STOCK), None)
    if stock is None or stock.output_tok_s <= 0:
        return summaries
    return [replace(s, ratio=round(s.output_tok_s / stock.output_tok_s, 3)) for s in summaries]


def verdict(summaries: list[Summary], configs: list[Configuration]) -> dict:
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


def peer_ratios(summaries: list[Summary], configs: list[Configuration]) -> list[dict]:
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


# -- the result document -----------------------------------------------------


def configs_from_dicts(items: list[dict]) -> list[Configuration]:
    out = []
    for d in items:
        servers = tuple(
            Server(
                **{
                    **s,
                    "docker_args": tuple(s["docker_args"]),
                    "serve_args": tuple(s.get("serve_args", ())),
                }
            )
            for s in d["servers"]
        )
        out.append(
            Configuration(
                name=d["name"],
                kind=d["kind"],
                summary=d["summary"],
                target=d["target"],
                servers=servers,
                same_as=tuple(d["same_as"]),
            )
        )
    return out


def config_dict(config: Configuration, image: str | None) -> dict:
    d = asdict(config)
    d["servers"] = [s.to_dict() for s in config.servers]
    d["shape"] = config.shape
    d["image"] = image
    return d


def instance_cores(server: Server, host_cores: int) -> list[int]:
    """Physical cores of each instance (DP rank) of a server: its OpenMP list, one CPU
    per core; "auto" (stock) is every core of the host."""
    if server.omp_bind == "auto":
        return [host_cores]
    return [len(cpu_ids(rank)) for rank in server.omp_bind.split("|")]


def roofline(
    summaries: list[Summary],
    configs: list[Configuration],
    weight_bytes: int,
    core_gbs: float,
    host_cores: int,
) -> list[dict]:
    """Per configuration: the weight bytes per second each instance streamed (every decode
    step reads every weight once, and a step takes the median TPOT) against what its cores
    can stream (cores x the planner's per-core bandwidth), as a percentage."""
    by_name = {c.name: c for c in configs}
    rows = []
    for s in summaries:
        cores = [n for srv in by_name[s.config].servers for n in instance_cores(srv, host_cores)]
        if not cores or s.tpot_ms <= 0 or weight_bytes <= 0 or core_gbs <= 0:
            continue  # the gateway has no servers of its own
        first = by_name[s.config].servers[0]
        step_bytes = (first.weight_bytes or weight_bytes) * GGUF_BYTES.get(first.gguf, 1.0)
        streamed = step_bytes / (s.tpot_ms / 1000) / 1e9
        available = core_gbs * statistics.mean(cores)
        rows.append(
            {
                "config": s.config,
                "weight_gbs": round(streamed, 2),
                "bandwidth_gbs": round(available, 2),
                "percent": round(100 * streamed / available, 1),
            }
        )
    return rows


def weight_ratios(summaries: list[Summary], configs: list[Configuration]) -> list[dict]:
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


def result_document(
    meta: dict, configs: list[Configuration], images: dict[str, str], runs: list[Run]
) -> dict:
    summaries = summarize(runs, configs)
    return {
        "meta": meta,
        "configurations": [config_dict(c, images.get(c.target)) for c in configs],
        "runs": [asdict(r) for r in runs],
        "summary": [asdict(s) for s in summaries],
        "verdict": verdict(summaries, configs),
        "peers": peer_ratios(summaries, configs),
        "weights": weight_ratios(summaries, configs),
        "roofline": roofline(
            summaries,
            configs,
            meta.get("weight_bytes", 0),
            meta.get("core_bandwidth_gbs", 0.0),
            meta.get("host_cores", 0),
        ),
    }
