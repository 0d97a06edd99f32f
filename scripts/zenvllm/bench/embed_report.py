"""The embedding bench's result document and its files: results.json, runs.csv,
summary.csv, table.md (inputs/s per configuration and batch size, the detail with
tokens/s and latency percentiles, the planner against stock and the peer, what ran)
and throughput.png (matplotlib only when plotting)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from zenvllm.bench import report
from zenvllm.bench.catalogue import PLANNER, STOCK
from zenvllm.bench.document import config_dict
from zenvllm.bench.embed_results import EmbedRun, EmbedSummary, derived
from zenvllm.bench.layouts import Configuration

KIND = "embed"  # meta.kind: bench/check.py hands such a directory to bench/embed_check.py


def result_document(
    meta: dict[str, Any],
    configs: list[Configuration],
    images: dict[str, str],
    runs: list[EmbedRun],
    facts: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The runs and what is derived from them; per configuration, what ran (facts)."""
    return {
        "meta": {**meta, "kind": KIND},
        "configurations": [
            config_dict(c, images.get(c.target)) | facts.get(c.name, {}) for c in configs
        ],
        "runs": [asdict(r) for r in runs],
        **derived(configs, runs),
    }


def rows_csv(rows: list[dict[str, Any]], names: list[str]) -> str:
    """Rows as CSV, a column per field (None as an empty cell)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def batches(summaries: list[EmbedSummary]) -> list[int]:
    return sorted({s.batch for s in summaries})


def main_table(summaries: list[EmbedSummary]) -> str:
    """Inputs/s: a row per configuration, a column per batch size."""
    sizes = batches(summaries)
    by = {(s.config, s.batch): s for s in summaries}
    names = list(dict.fromkeys(s.config for s in summaries))
    lines = [
        "| configuration | instances | " + " | ".join(f"batch {b}" for b in sizes) + " |",
        "|---|---|" + "---:|" * len(sizes),
    ]
    for name in names:
        shape = next(s.shape for s in summaries if s.config == name)
        cells = [f"{by[name, b].inputs_s:g}" if (name, b) in by else "-" for b in sizes]
        lines.append(f"| {name} | {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_row(s: EmbedSummary) -> str:
    ratio = f"{s.ratio:.3f}x" if s.ratio is not None else "n/a"
    return (
        f"| {s.config} | {s.batch} | {s.inputs_s:g} | {s.inputs_min:g}-{s.inputs_max:g} "
        f"| {s.tokens_s:g} | {s.p50_ms:g} | {s.p90_ms:g} | {s.p99_ms:g} | {ratio} |"
    )


def detail_table(summaries: list[EmbedSummary]) -> str:
    lines = [
        "| configuration | batch | inputs/s (median) | min-max | tokens/s | p50 ms | p90 ms "
        "| p99 ms | vs stock |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return "\n".join([*lines, *(detail_row(s) for s in summaries)])


def planner_row(r: dict[str, Any]) -> str:
    return (
        f"| {r['batch']} | {r['other']} | {r['inputs']:.3f}x | {r['p50']:.3f}x | {r['p99']:.3f}x |"
    )


def planner_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"The planner's layout ({PLANNER}) against {STOCK} and the peer at each batch size "
        "(planner / other; inputs/s above 1 and latency below 1 favour the planner):",
        "",
        "| batch | other | inputs/s | p50 | p99 |",
        "|---:|---|---:|---:|---:|",
    ]
    return "\n".join([*lines, *(planner_row(r) for r in rows)])


def ran_row(c: dict[str, Any]) -> str:
    start = c.get("start")
    ready = f"{start['ready_s']:g} s" if start else "-"
    cosine = c.get("cosine_to_stock")
    return f"| {c['name']} | {c['image']} | {c['serves']} | {ready} | {cosine if cosine else '-'} |"


def ran_table(configs: list[dict[str, Any]]) -> str:
    """What each configuration served and how it started; its vectors against stock's."""
    lines = [
        "What ran: each server's image and what it serves, its time to ready, and the cosine "
        f"of its vector for one sentence to {STOCK}'s (the same model must give the same "
        "vector):",
        "",
        "| configuration | image | serves | ready | cosine to stock |",
        "|---|---|---|---:|---:|",
    ]
    return "\n".join([*lines, *(ran_row(c) for c in configs if "serves" in c)])


def workload_line(meta: dict[str, Any]) -> str:
    w = meta["workload"]
    sizes = ", ".join(str(b) for b in w["batch_sizes"])
    return (
        f"Workload: random inputs of {w['input_len']} tokens (special tokens included), "
        f"{w['inputs']} per batch size and repeat in requests of {sizes} inputs at "
        f"concurrency {w['concurrency']} (split over one client per instance), "
        f"{w['warmup_inputs']} warm-up inputs per batch size excluded, {w['repeats']} "
        "repeat(s); median with min-max over repeats; latency: one request's, all of a "
        "repeat's requests."
    )


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    summaries = [EmbedSummary(**s) for s in result["summary"]]
    best = "; ".join(f"batch {b}: {c}" for b, c in result["best"].items())
    parts = [
        f"# zenvllm bench --embed: {meta['model']} on {meta['host']}",
        "",
        "Inputs/s (median over repeats) by batch size (inputs per request):",
        "",
        main_table(summaries),
        "",
        detail_table(summaries),
        "",
        workload_line(meta),
        f"CPU: {meta['cpu']}. Load average: {meta['load_before']} before, "
        f"{meta['load_after']} after ({meta['cpus']} CPUs); wall time {meta['wall_s']:.0f} s.",
        f"Most inputs/s: {best}.",
        *(f"- {n}" for n in meta.get("notes", [])),
    ]
    if result["planner_over"]:
        parts += ["", planner_table(result["planner_over"])]
    parts += ["", ran_table(result["configurations"])]
    return "\n".join(parts) + "\n"


def plot(result: dict[str, Any], path: Path) -> Path:
    """throughput.png: inputs/s per batch size, a bar per configuration, min-max whiskers."""
    plt = report.pyplot()
    summaries = [EmbedSummary(**s) for s in result["summary"]]
    names = list(dict.fromkeys(s.config for s in summaries))
    sizes = batches(summaries)
    fig, ax = plt.subplots(figsize=(max(6, 2 * len(sizes)), 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        mine = {s.batch: s for s in summaries if s.config == name}
        xs = [j + i * width for j, b in enumerate(sizes) if b in mine]
        mid = [mine[b].inputs_s for b in sizes if b in mine]
        err = [
            [mine[b].inputs_s - mine[b].inputs_min for b in sizes if b in mine],
            [mine[b].inputs_max - mine[b].inputs_s for b in sizes if b in mine],
        ]
        ax.bar(xs, mid, width, yerr=err, capsize=3, label=name)
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(sizes))])
    ax.set_xticklabels([f"batch {b}" for b in sizes])
    ax.set_ylabel("inputs/s (median, min-max)")
    ax.set_title(f"Embeddings: {result['meta']['model']} on {result['meta']['host']}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(result: dict[str, Any], out_dir: Path, plots: bool = True) -> list[Path]:
    """results.json, runs.csv, summary.csv, table.md and throughput.png into out_dir."""
    files = {
        "results.json": json.dumps(result, indent=2) + "\n",
        "runs.csv": rows_csv(result["runs"], [f.name for f in fields(EmbedRun)]),
        "summary.csv": rows_csv(result["summary"], [f.name for f in fields(EmbedSummary)]),
        "table.md": markdown(result),
    }
    written = []
    for name, text in files.items():
        (out_dir / name).write_text(text)
        written.append(out_dir / name)
    if plots and result["summary"]:
        written.append(plot(result, out_dir / "throughput.png"))
    return written
