"""The result document, pure: one shape for every model kind. A run's raw figures (the
meta, which names its kind; the configurations and what ran; the runs: a generating
model's throughput repeats and batch 1's, a pooling model's repeats at each batch size)
and everything derived from them, which the bench writes (bench/report.py) and
bench/check.py derives again to compare. A generating model's: summary rows, the
verdict, the planner against each peer and the other weights, the roofline, the quality
rows (bench/scored.py: a configuration beyond its format's bound is never the best), the
performance model's predictions beside the measured figures (bench/predicted.py). A pooling
model's: summary rows per batch size, the planner's quotients, the best per batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from zenvllm.bench import order, predicted, roofline, scored
from zenvllm.bench.catalogue import (
    ACCEPTANCE_RATIO,
    INFINITY,
    NEAR_BEST,
    PEER_KINDS,
    PLANNER,
    STOCK,
)
from zenvllm.bench.layouts import Configuration, Server
from zenvllm.bench.results import (
    PoolingRun,
    PoolingSummary,
    Run,
    Summary,
    summarize,
    summarize_batches,
)

GENERATION = "generation"  # meta.kind of a generating model's document (none: written before it)
POOLING = "embed"  # meta.kind of a pooling model's (the word the first embedding runs wrote)


def configs_from_dicts(items: list[dict[str, Any]]) -> list[Configuration]:
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
                serve_env=tuple((k, v) for k, v in d.get("serve_env", ())),
            )
        )
    return out


def config_dict(config: Configuration, image: str | None) -> dict[str, Any]:
    d = asdict(config)
    d["servers"] = [s.to_dict() for s in config.servers]
    d["shape"] = config.shape
    d["image"] = image
    return d


def derived(
    meta: dict[str, Any],
    configs: list[Configuration],
    runs: list[Run],
    batch1: list[Run] | tuple[Run, ...] = (),
    quality_runs: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    """Everything the document derives from its raw runs: summary rows, the verdict (the
    planner's batch-1 share too; none beyond its quality bound the best), the peers,
    other weights, the roofline, the quality rows and the performance model's predictions
    beside the measured figures (bench/predicted.py)."""
    summaries = summarize(runs, configs, batch1)
    if "order" in meta:  # recorded since runs pair each repeat with stock's by round
        summaries = order.with_spread(summaries, runs)
    rows = roofline.roofline(summaries, configs, meta)
    judged = scored.judged_rows(list(quality_runs))
    planner = next((r["within"] for r in judged if r["config"] == PLANNER), None)
    out = scored.beyond(judged)
    quality = {"beyond_bound": sorted(out), "planner_within": planner}
    fit = [s for s in summaries if s.config not in out]
    return {
        "summary": [asdict(s) for s in summaries],
        "verdict": {
            **verdict(summaries, configs, fit),
            **roofline.batch1_verdict(rows),
            **quality,
        },
        "peers": peer_ratios(summaries, configs),
        "weights": weight_ratios(summaries, configs),
        "roofline": rows,
        "quality": judged,
        "predictions": predicted.predictions(summaries, configs, meta),
    }


def assemble(
    kind: str,
    meta: dict[str, Any],
    configs: list[Configuration],
    images: dict[str, str],
    raw: dict[str, list[dict[str, Any]]],
    facts: dict[str, dict[str, Any]],
    derive: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Any kind's document: its meta (`kind` in it), per configuration what ran (facts),
    its raw rows (`raw`: runs, and batch1 for a generating model), then what `derive`
    (the kind's) gives from them, as bench/check.py derives it again."""
    doc: dict[str, Any] = {
        "meta": {**meta, "kind": kind},
        "configurations": [
            config_dict(c, images.get(c.target)) | facts.get(c.name, {}) for c in configs
        ],
        **raw,
    }
    return {**doc, **derive(doc)}


def result_document(
    meta: dict[str, Any],
    configs: list[Configuration],
    images: dict[str, str],
    runs: list[Run],
    batch1: list[Run] | tuple[Run, ...] = (),
    facts: dict[str, dict[str, Any]] | None = None,
    quality_runs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A generating model's: `runs`, the throughput workload's repeats; `batch1`, one
    request at a time; `facts`: per configuration, what ran (backend) and how it started
    (start, restart); `quality_runs`: what each one's first server scored."""
    raw: dict[str, list[dict[str, Any]]] = {
        "runs": [asdict(r) for r in runs],
        "batch1": [asdict(r) for r in batch1],
    }
    if quality_runs is not None:
        raw["quality_runs"] = quality_runs
    return assemble(GENERATION, meta, configs, images, raw, facts or {}, derive)


def pooling_document(
    meta: dict[str, Any],
    configs: list[Configuration],
    images: dict[str, str],
    runs: list[PoolingRun],
    facts: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """A pooling model's: its runs at each batch size; per configuration what ran."""
    raw = {"runs": [asdict(r) for r in runs]}
    return assemble(POOLING, meta, configs, images, raw, facts, derive_pooling)


def runs_of(result: dict[str, Any]) -> tuple[list[Run], list[Run]]:
    """The raw runs of a document read back: the throughput workload's, batch 1's."""
    return [Run(**r) for r in result["runs"]], [Run(**r) for r in result.get("batch1", [])]


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """A generating model's document: summary, verdict, peers, weights and roofline from
    its raw runs."""
    configs: list[Configuration] = configs_from_dicts(result["configurations"])
    runs, batch1 = runs_of(result)
    return derived(result["meta"], configs, runs, batch1, result.get("quality_runs", []))


# -- a generating model's verdict and ratios --------------------------------------------


def verdict(
    summaries: list[Summary], configs: list[Configuration], fit: list[Summary] | None = None
) -> dict[str, Any]:
    """Does the planner's auto layout reach the acceptance ratio, and is it the best
    layout of its image the sweep found? The best are chosen among `fit` (those within
    their quality bound; None: all)."""
    by_name = {s.config: s for s in summaries}
    kinds = {c.name: c for c in configs}
    planner = by_name.get(PLANNER)
    fit = summaries if fit is None else fit
    same_image = (
        [
            s
            for s in fit
            if kinds[s.config].kind == "plan" and kinds[s.config].target == kinds[PLANNER].target
        ]
        if planner
        else []
    )
    best = max(same_image, key=lambda s: s.output_tok_s, default=None)
    overall = max(fit, key=lambda s: s.output_tok_s, default=None)
    rival = best_rival(fit, configs)
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


# -- a pooling model's quotients ---------------------------------------------------------


def planner_over(summaries: list[PoolingSummary]) -> list[dict[str, Any]]:
    """The planner's layout over stock and over the peer at each batch size: inputs/s,
    p50 and p99 latency as quotients (planner / other: throughput above 1 and latency
    below 1 favour the planner)."""
    by = {(s.config, s.batch): s for s in summaries}
    rows = []
    for s in summaries:
        planner = by.get((PLANNER, s.batch))
        if s.config not in (STOCK, INFINITY) or planner is None:
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


def best_per_batch(summaries: list[PoolingSummary]) -> dict[str, str]:
    """The configuration with the most inputs/s at each batch size."""
    batches = sorted({s.batch for s in summaries})
    return {
        str(b): max((s for s in summaries if s.batch == b), key=lambda s: s.inputs_s).config
        for b in batches
    }


def pooling_derived(configs: list[Configuration], runs: list[PoolingRun]) -> dict[str, Any]:
    """Everything a pooling model's document derives from its runs."""
    summaries = summarize_batches(runs, configs)
    return {
        "summary": [asdict(s) for s in summaries],
        "planner_over": planner_over(summaries),
        "best": best_per_batch(summaries),
    }


def derive_pooling(result: dict[str, Any]) -> dict[str, Any]:
    """A pooling model's document: its derived figures from its raw runs."""
    configs = configs_from_dicts(result["configurations"])
    return pooling_derived(configs, [PoolingRun(**r) for r in result["runs"]])
