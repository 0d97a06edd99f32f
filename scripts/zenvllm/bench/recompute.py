"""A generating model's result document checked: its runs, and its derived figures
derived again from them and compared.

bench/check.py checks what every kind's document shares and hands the rest here. Every
configuration ran every repeat (and batch 1) with every request answered and every
token made; each rate and ratio is the quotient of the numbers beside it. It trusts no
stored verdict: the summary rows, the verdict (acceptance, the planner against stock,
the best layout and overall, the planner against the best that serves the same
weights, its batch-1 share), the peers, the other weights and the roofline are derived
again from the runs in results.json with the bench's own rules (bench/document.py),
and every difference is a problem; so are the quality rows, from the raw scores
(bench/scored.py), and a layout of the planner's beyond its quality bound. A roofline
share over 100% is one too: the bandwidth figure it divides by is too low. So are the
performance model's predictions, derived again from the meta and the configurations,
and the planner's layout off its prediction by more than the model's bound
(bench/predicted.py). table.md must show them as the report writes them.
"""

from __future__ import annotations

import statistics
from dataclasses import MISSING, fields
from typing import Any

from zenvllm.bench import document, predicted, roofline, scored
from zenvllm.bench.catalogue import (
    ACCEPTANCE_RATIO,
    NEAR_BEST,
    PEER_KINDS,
    PLANNER,
    REFERENCE_KIND,
    STOCK,
)
from zenvllm.bench.results import Run, Summary
from zenvllm.bench.roofline import has_batch1, roofline_row
from zenvllm.bench.tables import batch1_row, ratio_cell, verdict_lines, weights_row

# Verdict keys a document written before the peers table lacks.
PEER_KEYS = ("best_same_weights", "planner_vs_best", "near_best_ratio", "near_best")
# Verdict keys a document written before quality was measured lacks.
QUALITY_KEYS = ("beyond_bound", "planner_within")


def close(a: object, b: object) -> bool:
    """Equal, floats to a part in 10^9 (a JSON round trip keeps them exact)."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    return a == b


# Summary fields with a default that says "not known" (memory 0, no batch 1).
SILENT = {f.name: f.default for f in fields(Summary) if f.default is not MISSING}


def says_nothing(field: str, value: object) -> bool:
    return value is None or (field in SILENT and value == SILENT[field])


def row_problems(
    label: str, key: str, stored: list[dict[str, Any]], derived: list[dict[str, Any]]
) -> list[str]:
    """Rows keyed by `key`, every field derived again. A field the stored row lacks is
    fine when the derived value says nothing (None, or a default such as memory 0): a
    document written before that field existed."""
    problems = []
    have = {r[key]: r for r in stored}
    want = {r[key]: r for r in derived}
    problems += [
        f"{label}: no row for {name} (derived from its runs)" for name in want.keys() - have.keys()
    ]
    problems += [
        f"{label}: {name} has no runs to derive it from" for name in have.keys() - want.keys()
    ]
    for name in sorted(have.keys() & want.keys()):
        for field, value in want[name].items():
            if field not in have[name]:
                if not says_nothing(field, value):
                    problems.append(f"{label}: {name} lacks {field} (derived: {value})")
            elif not close(have[name][field], value):
                problems.append(
                    f"{label}: {name} {field} is {have[name][field]!r}, its runs give {value!r}"
                )
    return problems


def verdict_problems(
    stored: dict[str, Any], derived: dict[str, Any], before_peers: bool, before_quality: bool
) -> list[str]:
    problems = []
    for key, value in derived.items():
        if key not in stored:
            if not (
                (before_peers and key in PEER_KEYS) or (before_quality and key in QUALITY_KEYS)
            ):
                problems.append(f"verdict: {key} is missing (derived: {value!r})")
        elif not close(stored[key], value):
            problems.append(f"verdict: {key} is {stored[key]!r}, the runs give {value!r}")
    problems += [
        f"verdict: {key} is not a verdict the bench gives" for key in stored.keys() - derived.keys()
    ]
    return problems


def over_problems(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """A share over 100% streams more than the cores can: the figure is wrong."""
    problems = []
    for r in rows:
        for prefix, what in (("", "the throughput workload"), ("batch1_", "batch 1")):
            if roofline.over(r.get(f"{prefix}percent")):
                problems.append(
                    f"roofline: {r['config']} at {what} streamed {r[f'{prefix}weight_gbs']} GB/s "
                    f"of weights, over its {r[f'{prefix}bandwidth_gbs']} GB/s "
                    f"({r[f'{prefix}percent']}%): the bandwidth figure is too low "
                    f"({meta.get('bandwidth_source') or 'unknown source'})"
                )
    return problems


def batch1_problems(result: dict[str, Any]) -> list[str]:
    """With batch1_prompts in the workload, every configuration that ran and has servers
    of its own made one batch-1 run of that many prompts, one at a time, every token."""
    w = result["meta"]["workload"]
    prompts = w.get("batch1_prompts", 0)
    batch1 = [Run(**r) for r in result.get("batch1", [])]
    ran = {r["config"] for r in result["runs"]}
    served = {c["name"] for c in result["configurations"] if c["servers"]} & ran
    problems = []
    if prompts:
        mine = {r.config for r in batch1}
        problems += [f"{name}: no batch-1 run" for name in sorted(served - mine)]
    elif batch1:
        problems.append(f"batch 1: {len(batch1)} runs, but the workload asks for none")
    for r in batch1:
        where = f"{r.config} batch 1"
        if r.config not in served:
            problems.append(f"{where}: not a configuration that ran with servers of its own")
        if r.concurrency != 1 or r.clients != 1:
            problems.append(f"{where}: concurrency {r.concurrency}, {r.clients} client(s), not 1")
        if r.failed or r.completed != prompts:
            problems.append(f"{where}: {r.completed} completed, {r.failed} failed of {prompts}")
        if r.output_tokens != prompts * w["output_len"]:
            problems.append(
                f"{where}: {r.output_tokens} output tokens, expected {prompts} x {w['output_len']}"
            )
        rate = r.output_tokens / r.window_s
        if abs(rate - r.output_tok_s) > 0.01 + 1e-4 * rate:
            problems.append(f"{where}: output_tok_s {r.output_tok_s} is not {rate:.2f}")
    return problems


def problems(result: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    """Every derived figure of the document against the same figure derived again
    (`derive(result)`)."""
    found = row_problems("summary", "config", result["summary"], derived["summary"])
    before_peers = "peers" not in result
    before_quality = "quality" not in result
    found += verdict_problems(result["verdict"], derived["verdict"], before_peers, before_quality)
    if not before_quality or derived["quality"]:
        found += row_problems("quality", "config", result.get("quality", []), derived["quality"])
        found += scored.planner_problems(derived["quality"], result["configurations"])
    if "roofline" in result or derived["roofline"]:
        found += row_problems("roofline", "config", result.get("roofline", []), derived["roofline"])
    found += over_problems(derived["roofline"], result["meta"])
    if "predictions" in result:  # documents written before the predictions have none
        stored = result["predictions"]
        found += row_problems("predictions", "config", stored, derived["predictions"])
    found += predicted.planner_problems(derived["predictions"])
    return found + batch1_problems(result)


def backend_problems(configurations: list[dict[str, Any]]) -> list[str]:
    """A configuration whose acceleration did not run is not what its name says."""
    return [
        f"{c['name']}: its {c['target']} acceleration did not run (platform "
        f"{c['backend']['platform']}, {c['backend']['accelerated_calls']} calls of its "
        "operators): not a measurement of that target"
        for c in configurations
        if c.get("backend", {}).get("active") is False
    ]


def run_problems(name: str, r: dict[str, Any], w: dict[str, Any]) -> list[str]:
    """A repeat that lost requests or tokens, or whose rate does not follow from them."""
    problems = []
    if r["failed"] or r["completed"] != w["num_prompts"]:
        problems.append(
            f"{name} repeat {r['repeat']}: {r['completed']} completed, "
            f"{r['failed']} failed of {w['num_prompts']}"
        )
    if r["output_tokens"] != w["num_prompts"] * w["output_len"]:
        problems.append(
            f"{name} repeat {r['repeat']}: {r['output_tokens']} output tokens,"
            f" expected {w['num_prompts']} x {w['output_len']}"
        )
    rate = r["output_tokens"] / r["window_s"]
    if abs(rate - r["output_tok_s"]) > 0.01 + 1e-4 * rate:
        problems.append(
            f"{name} repeat {r['repeat']}: output_tok_s {r['output_tok_s']} "
            f"is not output_tokens / window_s = {rate:.2f}"
        )
    return problems


def config_problems(
    name: str, mine: list[dict[str, Any]], s: dict[str, Any] | None, w: dict[str, Any]
) -> list[str]:
    """One configuration: every repeat ran cleanly and its summary row follows from them."""
    problems = []
    if len(mine) != w["repeats"]:
        problems.append(f"{name}: {len(mine)} runs, expected {w['repeats']} repeats")
    for r in mine:
        problems += run_problems(name, r, w)
    if s is None:
        return [*problems, f"{name}: no summary row"]
    out = [r["output_tok_s"] for r in mine]
    if out and (s["output_tok_s"], s["output_min"], s["output_max"]) != (
        round(statistics.median(out), 1),
        round(min(out), 1),
        round(max(out), 1),
    ):
        problems.append(f"{name}: summary {s['output_tok_s']} is not the median of {out}")
    return problems


def ratio_problems(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Every ratio is a quotient by stock's throughput, so stock's row must be there."""
    stock = summary.get(STOCK)
    if stock is None:
        return ["no stock summary: ratios have no baseline"]
    problems = []
    for s in summary.values():
        want = round(s["output_tok_s"] / stock["output_tok_s"], 3)
        if s["ratio"] is None or abs(s["ratio"] - want) > 5e-4:
            problems.append(
                f"{s['config']}: ratio {s['ratio']} is not "
                f"{s['output_tok_s']} / {stock['output_tok_s']} = {want}"
            )
    return problems


def peer_problems(
    peers: list[dict[str, Any]], summary: dict[str, dict[str, Any]], configs: list[dict[str, Any]]
) -> list[str]:
    """A row per peer that ran (and stock), each the quotient of the summary rows."""
    planner = summary.get(PLANNER)
    wanted = {c["name"] for c in configs if c["kind"] in PEER_KINDS} | {STOCK}
    wanted &= set(summary)
    if planner is None:
        return []
    problems = []
    rows = {r["peer"]: r for r in peers}
    for name in sorted(wanted - set(rows)):
        problems.append(f"peers: no row for {name}")
    for name, r in rows.items():
        peer = summary.get(name)
        if peer is None:
            problems.append(f"peers: {name} has no summary row")
            continue
        for key, field in (("output", "output_tok_s"), ("ttft", "ttft_ms"), ("tpot", "tpot_ms")):
            want = round(planner[field] / peer[field], 3)
            if abs(r[key] - want) > 5e-4:
                problems.append(
                    f"peers: {name} {key} {r[key]} is not {planner[field]} / {peer[field]} = {want}"
                )
    return problems


def weights_problems(
    rows: list[dict[str, Any]], summary: dict[str, dict[str, Any]], configs: list[dict[str, Any]]
) -> list[str]:
    """A row per other copy of the weights that ran, each the quotient of summary rows."""
    planner = summary.get(PLANNER)
    copies = {c["name"] for c in configs if any(s.get("model_dir") for s in c["servers"])}
    if planner is None:
        return []
    by_name = {r["weights"]: r for r in rows}
    problems = [f"weights: no row for {n}" for n in sorted((copies & set(summary)) - set(by_name))]
    for name, r in by_name.items():
        mine = summary.get(name)
        if mine is None or name not in copies:
            problems.append(f"weights: {name} is not another copy of the weights that ran")
            continue
        for key, field in WEIGHT_FIELDS:
            want = round(mine[field] / planner[field], 3) if planner.get(field) else None
            got = r.get(key)
            if (got is None) != (want is None) or (got is not None and abs(got - want) > 5e-4):
                problems.append(
                    f"weights: {name} {key} {r[key]} is not {mine[field]} / {planner[field]}"
                )
    return problems


WEIGHT_FIELDS = (
    ("output", "output_tok_s"),
    ("ttft", "ttft_ms"),
    ("tpot", "tpot_ms"),
    ("memory", "memory_mib"),
)


def table_problems(
    table: str, summary: dict[str, dict[str, Any]], peers: list[dict[str, Any]]
) -> list[str]:
    """table.md (its text) is what people read: it must show each row's name, throughput
    and ratio, and each peer's quotients."""
    problems = []
    for r in peers:
        row = f"| {r['peer']} | {r['output']:.3f}x | {r['ttft']:.3f}x | {r['tpot']:.3f}x |"
        if row not in table:
            problems.append(f"table.md lacks the peer row {row!r}")
    for s in summary.values():
        if s["ratio"] is None:
            continue
        ratio = ratio_cell(Summary(**s))
        for text in (f"| {s['config']}", f"{s['output_tok_s']:g}", f"| {ratio} |"):
            if text not in table:
                problems.append(f"table.md lacks {text!r} for {s['config']}")
    return problems


def shown_problems(table: str, result: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    """The verdict in words as the runs give it (a document from before the peers
    table, with its verdict's keys only), the batch-1 rows, the weights, roofline and
    prediction rows, as the report writes them (in table.md's text)."""
    rows = result.get("roofline", [])
    verdict = derived["verdict"]
    if "peers" not in result:
        verdict = {k: v for k, v in verdict.items() if k in result["verdict"]}
    wanted = [("verdict line", line) for line in verdict_lines(verdict)]
    wanted += [("weights row", weights_row(r)) for r in result.get("weights", [])]
    wanted += [("roofline row", roofline_row(r, has_batch1(rows))) for r in rows]
    wanted += [
        ("prediction row", predicted.prediction_row(r)) for r in result.get("predictions", [])
    ]
    wanted += [
        ("batch-1 row", batch1_row(Summary(**s)))
        for s in result["summary"]
        if s.get("batch1_tpot_ms") is not None
    ]
    return [f"table.md lacks the {kind} {text!r}" for kind, text in wanted if text not in table]


def generation_problems(result: dict[str, Any]) -> list[str]:
    """What a generating model's runs and stored rows say against each other, before
    anything is derived again."""
    w = result["meta"]["workload"]
    summary = {s["config"]: s for s in result["summary"]}
    found = []
    for c in result["configurations"]:
        if c["kind"] == REFERENCE_KIND:  # scored only
            continue
        mine = [r for r in result["runs"] if r["config"] == c["name"]]
        found += config_problems(c["name"], mine, summary.get(c["name"]), w)
    return found + ratio_problems(summary) + backend_problems(result["configurations"])


def generation_derived_problems(result: dict[str, Any]) -> list[str]:
    """Its derived figures, derived again (raises where they cannot be)."""
    summary = {s["config"]: s for s in result["summary"]}
    found = problems(result, document.derive(result))
    if "peers" in result:  # documents written before the peers table have none
        found += peer_problems(result["peers"], summary, result["configurations"])
    return found + weights_problems(result.get("weights", []), summary, result["configurations"])


def generation_table_problems(result: dict[str, Any], table: str) -> list[str]:
    """table.md shows each row, ratio, peer, the verdict in words and the other tables."""
    summary = {s["config"]: s for s in result["summary"]}
    found = table_problems(table, summary, result.get("peers", []))
    found += [
        f"table.md lacks the quality row {scored.line(r)!r}"
        for r in result.get("quality", [])
        if scored.line(r) not in table
    ]
    return found + shown_problems(table, result, document.derive(result))


def generation_judged(
    result: dict[str, Any], acceptance: bool, near_best: bool
) -> tuple[list[str], str]:
    """A consistent document judged by the verdict its runs give (--acceptance: the
    planner at ACCEPTANCE_RATIO x stock; --near-best: at NEAR_BEST x the best that serves
    the same weights): the problems, and the line that says it holds."""
    verdict = document.derive(result)["verdict"]
    found = []
    if acceptance and not verdict["meets_acceptance"]:
        found.append(
            f"the planner's layout ({verdict['planner']}) made {verdict['planner_ratio']}x "
            f"stock output throughput, under the {ACCEPTANCE_RATIO}x acceptance"
        )
    if near_best and not verdict.get("near_best"):
        found.append(
            f"the planner's layout ({verdict['planner']}) made "
            f"{verdict.get('planner_vs_best')}x of the best that serves the same weights "
            f"({verdict.get('best_same_weights')}), under {NEAR_BEST}x"
        )
    return found, f"complete and consistent; planner {verdict['planner_ratio']}x stock"
