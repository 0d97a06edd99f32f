"""A bench result document as files: JSON, CSV, a Markdown table shaped like
AMD's ZenDNN table with the detail, batch-1, peer, weights and roofline tables
(bench/roofline.py writes its own), and PNG plots (matplotlib is imported only when
plotting)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, fields
from pathlib import Path
from types import ModuleType
from typing import Any

from zenvllm.bench.catalogue import ACCEPTANCE_RATIO, PLANNER, STOCK
from zenvllm.bench.document import configs_from_dicts
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.results import Run, Summary
from zenvllm.bench.roofline import OVER, cached_note, over, percent_text, roofline_table
from zenvllm.core.errors import UserError
from zenvllm.deploy.playbooks import BENCH_EXTRA

# -- writers -----------------------------------------------------------------


def runs_csv(runs: list[Run]) -> str:
    """Every run: the throughput repeats, then batch 1's (concurrency 1)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[f.name for f in fields(Run)], lineterminator="\n")
    writer.writeheader()
    for r in runs:
        writer.writerow(asdict(r))
    return buf.getvalue()


def summary_csv(summaries: list[Summary]) -> str:
    buf = io.StringIO()
    names = [f.name for f in fields(Summary)]
    writer = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for s in summaries:
        writer.writerow(asdict(s))  # None (no ratio, no batch 1) as an empty cell
    return buf.getvalue()


def amd_table(summaries: list[Summary], model: str) -> str:
    """AMD's ZenDNN table: a row per model, output tok/s per configuration, then the
    ratio of the planner's layout to the baseline."""
    names = [s.config for s in summaries]
    planner = next((s for s in summaries if s.config == PLANNER), None)
    head = ["Model", *names, f"{PLANNER}vs{STOCK}"]
    row = [model, *(f"{s.output_tok_s:g}" for s in summaries)]
    row.append(f"{planner.ratio:.3f}" if planner and planner.ratio is not None else "n/a")
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), "| " + " | ".join(row) + " |"]
    )


def detail_table(summaries: list[Summary], configs: list[Configuration]) -> str:
    by_name = {c.name: c for c in configs}
    lines = [
        "| configuration | instances | output tok/s (median) | min-max | total tok/s "
        "| TTFT ms | TPOT ms | memory MiB | vs stock |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        config = by_name[s.config]
        name = s.config + (f" (= {', '.join(config.same_as)})" if config.same_as else "")
        ratio = f"{s.ratio:.3f}x" if s.ratio is not None else "n/a"
        lines.append(
            f"| {name} | {s.shape} | {s.output_tok_s:g} | {s.output_min:g}-{s.output_max:g} "
            f"| {s.total_tok_s:g} | {s.ttft_ms:g} | {s.tpot_ms:g} | {s.memory_mib or 'n/a'} "
            f"| {ratio} |"
        )
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    summaries = [Summary(**s) for s in result["summary"]]
    configs = configs_from_dicts(result["configurations"])
    w = meta["workload"]
    parts = [
        f"# zenvllm bench: {meta['model']} on {meta['host']}",
        "",
        amd_table(summaries, meta["model"]),
        "",
        detail_table(summaries, configs),
        "",
        f"Workload: random {w['input_len']} in / {w['output_len']} out tokens, "
        f"{w['num_prompts']} prompts at concurrency {w['concurrency']} per configuration "
        f"(split over one client per instance), {w['warmup_prompts']} warm-up prompts "
        f"excluded, {w['repeats']} repeat(s); median with min-max over repeats.",
        f"Load average: {meta['load_before']} before, {meta['load_after']} after "
        f"({meta['cpus']} CPUs); wall time {meta['wall_s']:.0f} s.",
        *verdict_lines(result["verdict"]),
    ]
    parts += [f"- {n}" for n in meta.get("notes", [])]
    if any(s.batch1_tpot_ms is not None for s in summaries):
        parts += ["", batch1_table(summaries, w)]
    if any("backend" in c for c in result["configurations"]):
        parts += ["", ran_table(result["configurations"])]
    if result.get("peers"):
        parts += ["", peers_table(result["peers"])]
    if result.get("weights"):
        parts += ["", weights_table(result["weights"])]
    if result.get("roofline"):
        parts += ["", roofline_table(result["roofline"], meta)]
    elif cached_note(meta):
        parts += ["", cached_note(meta)]
    return "\n".join(parts) + "\n"


def ran_table(configs: list[dict[str, Any]]) -> str:
    """What each configuration's first server ran, read back from it (bench/backend.py),
    and how long it took to be ready: its start and, for the planner, a restart."""
    lines = [
        "What ran, read back from each server (platform: vLLM's own `current_platform` in "
        "the container; operators: vLLM's profiler over one request), and time to ready:",
        "",
        "| configuration | platform | accelerator | busiest operator (calls) | start | restart |",
        "|---|---|---|---|---:|---:|",
    ]
    for c in configs:
        ran = c.get("backend")
        if ran is None:
            continue
        top = ran["top_ops"][:1]
        busiest = f"{top[0]['op']} ({top[0]['calls']})" if top else "-"
        accel = (
            f"{'active' if ran['active'] else 'INACTIVE'} ({ran['accelerated_calls']} calls)"
            if "active" in ran
            else "-"
        )
        lines.append(
            f"| {c['name']} | {ran['platform']} | {accel} | {busiest} | "
            f"{ready(c.get('start'))} | {ready(c.get('restart'))} |"
        )
    return "\n".join(lines)


def ready(start: dict[str, Any] | None) -> str:
    return f"{start['ready_s']:g} s ({start['compile_cache']})" if start else "-"


def verdict_lines(v: dict[str, Any]) -> list[str]:
    """The verdict in words (check.py looks for them in table.md)."""
    met = "met" if v["meets_acceptance"] else "NOT met"
    lines = [
        f"Planner ({v['planner']}): {v['planner_ratio']}x stock "
        f"(acceptance {v['acceptance_ratio']}x: {met});"
        f" best layout of its image: {v['best_layout']}; best overall: {v['best_overall']}."
    ]
    if v.get("best_same_weights"):
        lines.append(
            f"Planner against the best that serves the same weights ({v['best_same_weights']}):"
            f" {v['planner_vs_best']}x (within {1 - v['near_best_ratio']:.0%}: "
            f"{'yes' if v['near_best'] else 'NO'})."
        )
    percent = v.get("planner_batch1_percent")
    if percent is not None:
        goal = {True: "met", False: "NOT met", None: "unknown"}[v["planner_batch1_goal_met"]]
        share = (
            f"{percent_text(percent)} of its instance's bandwidth"
            if not over(percent)
            else f"more weight bytes than its instance's bandwidth figure allows ({OVER})"
        )
        lines.append(f"Planner at batch 1: {share} (goal {v['batch1_goal_percent']:g}%: {goal}).")
    return lines


def batch1_table(summaries: list[Summary], w: dict[str, Any]) -> str:
    """One request at a time against the throughput workload's latencies."""
    lines = [
        f"Batch 1: {w['batch1_prompts']} prompts one at a time to each configuration's "
        f"first instance after its repeats (same lengths; medians), beside the throughput "
        f"workload's TPOT at concurrency {w['concurrency']}:",
        "",
        "| configuration | TTFT ms | TPOT ms | output tok/s "
        f"| TPOT ms at concurrency {w['concurrency']} |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [batch1_row(s) for s in summaries if s.batch1_tpot_ms is not None]
    return "\n".join(lines)


def batch1_row(s: Summary) -> str:
    return (
        f"| {s.config} | {s.batch1_ttft_ms:g} | {s.batch1_tpot_ms:g} | "
        f"{s.batch1_output_tok_s:g} | {s.tpot_ms:g} |"
    )


def peers_table(rows: list[dict[str, Any]]) -> str:
    """The planner's layout over each baseline and peer: quotients of the summary rows."""
    lines = [
        f"The planner's layout ({PLANNER}) against each peer (planner / peer; throughput "
        "above 1 and latencies below 1 favour the planner):",
        "",
        "| peer | output tok/s | TTFT | TPOT |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['peer']} | {r['output']:.3f}x | {r['ttft']:.3f}x | {r['tpot']:.3f}x |" for r in rows
    ]
    return "\n".join(lines)


def weights_table(rows: list[dict[str, Any]]) -> str:
    """Each other copy of the weights over the planner's layout on --model's."""
    lines = [
        f"Other weights of the same model, each with the planner's layout for it, against "
        f"{PLANNER} on --model's (copy / {PLANNER}; memory as docker stats reports the servers):",
        "",
        "| weights | output tok/s | TTFT | TPOT | memory |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [weights_row(r) for r in rows]
    return "\n".join(lines)


def weights_row(r: dict[str, Any]) -> str:
    memory = f"{r['memory']:.3f}x" if r["memory"] is not None else "n/a"
    return (
        f"| {r['weights']} | {r['output']:.3f}x | {r['ttft']:.3f}x | {r['tpot']:.3f}x | {memory} |"
    )


# -- plots -------------------------------------------------------------------


def plot(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """throughput.png (median bars, min-max whiskers, the 1.3x line) and latency.png."""
    plt = pyplot()
    summaries = [Summary(**s) for s in result["summary"]]
    names = [s.config for s in summaries]
    colors = ["#7f7f7f" if n == STOCK else "#d62728" if n == PLANNER else "#1f77b4" for n in names]
    title = f"{result['meta']['model']} on {result['meta']['host']}"
    paths = [out_dir / "throughput.png", out_dir / "latency.png"]
    throughput_plot(plt, summaries, colors, title, paths[0])
    latency_plot(plt, summaries, colors, title, paths[1])
    return paths


def pyplot() -> ModuleType:
    """matplotlib is optional (the bench extra), so it is imported only when plotting,
    headless (Agg), and its absence is a UserError naming the fix."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise UserError(
            f"plots need matplotlib ({err}); install the bench extra ({BENCH_EXTRA}) "
            "or pass --no-plots"
        ) from None
    return plt


def throughput_plot(
    plt: ModuleType, summaries: list[Summary], colors: list[str], title: str, path: Path
) -> None:
    """Output tok/s per configuration, each bar labelled with its ratio to stock, and
    the acceptance line the planner's bar has to clear."""
    names = [s.config for s in summaries]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4.5))
    med = [s.output_tok_s for s in summaries]
    err = [
        [m - s.output_min for m, s in zip(med, summaries, strict=True)],
        [s.output_max - m for m, s in zip(med, summaries, strict=True)],
    ]
    ax.bar(names, med, yerr=err, capsize=4, color=colors)
    for i, s in enumerate(summaries):
        if s.ratio is not None:
            ax.annotate(
                f"{s.ratio:.2f}x",
                (i, s.output_max),
                ha="center",
                va="bottom",
                xytext=(0, 3),
                textcoords="offset points",
            )
    stock = next((s for s in summaries if s.config == STOCK), None)
    if stock:
        ax.axhline(
            stock.output_tok_s * ACCEPTANCE_RATIO,
            ls="--",
            color="#2ca02c",
            lw=1,
            label=f"{ACCEPTANCE_RATIO}x stock",
        )
        ax.legend(loc="lower right")
    ax.set_ylabel("output tokens/s (median, min-max)")
    ax.set_ylim(0, max(s.output_max for s in summaries) * 1.12)  # room for the ratios
    ax.set_title(f"Output throughput\n{title}", fontsize=10)
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_plot(
    plt: ModuleType, summaries: list[Summary], colors: list[str], title: str, path: Path
) -> None:
    """TTFT and TPOT side by side: throughput bought with latency should show."""
    names = [s.config for s in summaries]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8, 2 * len(names)), 4.2))
    for ax, key, label in ((left, "ttft", "TTFT ms"), (right, "tpot", "TPOT ms")):
        mid = [getattr(s, f"{key}_ms") for s in summaries]
        lo = [m - getattr(s, f"{key}_min") for m, s in zip(mid, summaries, strict=True)]
        hi = [getattr(s, f"{key}_max") - m for m, s in zip(mid, summaries, strict=True)]
        ax.bar(names, mid, yerr=[lo, hi], capsize=4, color=colors)
        ax.set_ylabel(f"{label} (median of per-run medians)")
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"Latency: {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result: dict[str, Any], out_dir: Path, plots: bool = True) -> list[Path]:
    """results.json, runs.csv, summary.csv, table.md and the PNGs into out_dir."""
    runs = [Run(**r) for r in (*result["runs"], *result.get("batch1", []))]
    summaries = [Summary(**s) for s in result["summary"]]
    files = {
        "results.json": json.dumps(result, indent=2) + "\n",
        "runs.csv": runs_csv(runs),
        "summary.csv": summary_csv(summaries),
        "table.md": markdown(result),
    }
    written = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    if plots and summaries:
        written += plot(result, out_dir)
    return written
