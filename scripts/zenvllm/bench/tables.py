"""The report's Markdown tables (table.md), for each model kind.

A generating model's: AMD's ZenDNN table shape, the detail, batch 1, what ran, the
planner against each peer and the other weights (bench/roofline.py writes the
roofline's, bench/predicted.py the predicted against measured). A pooling model's:
inputs/s per configuration and batch size, the detail with tokens/s and latency
percentiles, the planner against stock and the peer, what ran and its vector against
stock's. bench/check.py looks for their rows in table.md.
A generating model's quality (bench/scored.py) stands beside its tokens/s.
"""

from __future__ import annotations

from typing import Any

from zenvllm.bench import scored
from zenvllm.bench.catalogue import PLANNER, STOCK
from zenvllm.bench.document import configs_from_dicts
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.predicted import predictions_table
from zenvllm.bench.results import PoolingSummary, Summary
from zenvllm.bench.roofline import OVER, cached_note, over, percent_text, roofline_table

# -- a generating model's ------------------------------------------------------------


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


def detail_table(
    summaries: list[Summary],
    configs: list[Configuration],
    quality: list[dict[str, Any]] | None = None,
) -> str:
    """A row per configuration: tokens/s, latencies, memory, and (`quality`: its rows)
    its perplexity gap to the float32 reference and greedy agreement beside them."""
    by_name = {c.name: c for c in configs}
    judged = {r["config"]: r for r in quality or []}
    lines = [
        "| configuration | instances | output tok/s (median) | min-max | total tok/s "
        "| TTFT ms | TPOT ms | memory MiB | vs stock |"
        + (" quality vs float32 |" if quality else ""),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---|" if quality else ""),
    ]
    for s in summaries:
        config = by_name[s.config]
        name = s.config + (f" (= {', '.join(config.same_as)})" if config.same_as else "")
        lines.append(
            f"| {name} | {s.shape} | {s.output_tok_s:g} | {s.output_min:g}-{s.output_max:g} "
            f"| {s.total_tok_s:g} | {s.ttft_ms:g} | {s.tpot_ms:g} | {s.memory_mib or 'n/a'} "
            f"| {ratio_cell(s)} |" + (f" {scored.cell(judged.get(s.config))} |" if quality else "")
        )
    return "\n".join(lines)


def ratio_cell(s: Summary) -> str:
    """The ratio to stock, with its repeats' spread where the run paired them."""
    if s.ratio is None:
        return "n/a"
    if s.ratio_min is None or s.ratio_max is None:
        return f"{s.ratio:.3f}x"
    return f"{s.ratio:.3f}x ({s.ratio_min:.3f}-{s.ratio_max:.3f})"


def generation_markdown(result: dict[str, Any]) -> str:
    """A generating model's table.md."""
    meta = result["meta"]
    summaries = [Summary(**s) for s in result["summary"]]
    configs = configs_from_dicts(result["configurations"])
    w = meta["workload"]
    parts = [
        f"# zenvllm bench: {meta['model']} on {meta['host']}",
        "",
        amd_table(summaries, meta["model"]),
        "",
        detail_table(summaries, configs, result.get("quality")),
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
    if result.get("quality"):
        parts += ["", scored.table(result["quality"])]
    if result.get("peers"):
        parts += ["", peers_table(result["peers"])]
    if result.get("weights"):
        parts += ["", weights_table(result["weights"])]
    if result.get("roofline"):
        parts += ["", roofline_table(result["roofline"], meta)]
    elif cached_note(meta):
        parts += ["", cached_note(meta)]
    if result.get("predictions"):
        parts += ["", predictions_table(result["predictions"])]
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
    if v.get("beyond_bound"):
        lines.append(
            f"Beyond their format's quality bound, left out of the best: "
            f"{', '.join(v['beyond_bound'])}"
            + (
                " (the planner's layout among them: it fails the check)."
                if v["planner_within"] is False
                else "."
            )
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


# -- a pooling model's ---------------------------------------------------------------


def batch_sizes(summaries: list[PoolingSummary]) -> list[int]:
    return sorted({s.batch for s in summaries})


def inputs_table(summaries: list[PoolingSummary]) -> str:
    """Inputs/s: a row per configuration, a column per batch size."""
    sizes = batch_sizes(summaries)
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


def batch_row(s: PoolingSummary) -> str:
    ratio = f"{s.ratio:.3f}x" if s.ratio is not None else "n/a"
    return (
        f"| {s.config} | {s.batch} | {s.inputs_s:g} | {s.inputs_min:g}-{s.inputs_max:g} "
        f"| {s.tokens_s:g} | {s.p50_ms:g} | {s.p90_ms:g} | {s.p99_ms:g} | {ratio} |"
    )


def batch_table(summaries: list[PoolingSummary]) -> str:
    lines = [
        "| configuration | batch | inputs/s (median) | min-max | tokens/s | p50 ms | p90 ms "
        "| p99 ms | vs stock |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return "\n".join([*lines, *(batch_row(s) for s in summaries)])


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


def probe_row(c: dict[str, Any]) -> str:
    start = c.get("start")
    ready = f"{start['ready_s']:g} s" if start else "-"
    cosine = c.get("cosine_to_stock")
    return f"| {c['name']} | {c['image']} | {c['serves']} | {ready} | {cosine if cosine else '-'} |"


def probe_table(configs: list[dict[str, Any]]) -> str:
    """What each configuration served and how it started; its vectors against stock's."""
    lines = [
        "What ran: each server's image and what it serves, its time to ready, and the cosine "
        f"of its vector for one sentence to {STOCK}'s (the same model must give the same "
        "vector):",
        "",
        "| configuration | image | serves | ready | cosine to stock |",
        "|---|---|---|---:|---:|",
    ]
    return "\n".join([*lines, *(probe_row(c) for c in configs if "serves" in c)])


def batch_workload(meta: dict[str, Any]) -> str:
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


def pooling_markdown(result: dict[str, Any]) -> str:
    """A pooling model's table.md."""
    meta = result["meta"]
    summaries = [PoolingSummary(**s) for s in result["summary"]]
    best = "; ".join(f"batch {b}: {c}" for b, c in result["best"].items())
    parts = [
        f"# zenvllm bench --embed: {meta['model']} on {meta['host']}",
        "",
        "Inputs/s (median over repeats) by batch size (inputs per request):",
        "",
        inputs_table(summaries),
        "",
        batch_table(summaries),
        "",
        batch_workload(meta),
        f"CPU: {meta['cpu']}. Load average: {meta['load_before']} before, "
        f"{meta['load_after']} after ({meta['cpus']} CPUs); wall time {meta['wall_s']:.0f} s.",
        f"Most inputs/s: {best}.",
        *(f"- {n}" for n in meta.get("notes", [])),
    ]
    if result["planner_over"]:
        parts += ["", planner_table(result["planner_over"])]
    parts += ["", probe_table(result["configurations"])]
    return "\n".join(parts) + "\n"
