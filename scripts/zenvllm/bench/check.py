"""Is a bench output directory complete and consistent?

`python -m zenvllm.bench.check DIR [--acceptance] [--near-best]`: every configuration
ran every repeat (and batch 1) with the same workload, every derived figure (summary,
ratios, verdict, peers, roofline) follows from the raw runs (bench/recompute.py derives
them again; a stored verdict is never trusted), the CSVs and the table say what
results.json says, the plots are PNGs.
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

from zenvllm.bench import embed_check, recompute
from zenvllm.bench.catalogue import ACCEPTANCE_RATIO, NEAR_BEST, PEER_KINDS, PLANNER, STOCK
from zenvllm.bench.report import batch1_row, verdict_lines, weights_row
from zenvllm.bench.results import Summary
from zenvllm.bench.roofline import has_batch1, roofline_row
from zenvllm.core import gate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR chunk; None when it is not a PNG."""
    try:
        head = (gate.read_bytes(path, 64 * gate.MIB, "", optional=True) or b"")[:24]
    except gate.InputError:
        return None
    if len(head) < 24 or head[:8] != PNG_MAGIC or head[12:16] != b"IHDR":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def same(a: object, b: object) -> bool:
    """A CSV cell against a JSON value."""
    if b is None:
        return a == ""
    if isinstance(b, float | int) and not isinstance(b, bool):
        try:
            return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))  # type: ignore[arg-type]
        except ValueError:
            return False
    return str(a) == str(b)


def check_outputs(out_dir: Path, expect: list[str] | None = None) -> list[str]:
    """Every way a bench output directory can be incomplete or inconsistent, as messages.

    Empty means: every configuration ran every repeat (and batch 1) with the same
    workload, the summary is the median/min/max of the runs, each ratio is the quotient
    of the numbers beside it, the verdict and the roofline are what the runs give, no
    share exceeds 100%, the CSVs say what the JSON says, the table shows them, and
    the plots are real PNGs."""
    problems: list[str] = []
    try:
        result = gate.read_json(out_dir / "results.json", gate.DOCUMENT, "run the bench again")
    except gate.InputError as err:
        return [f"results.json: {err}"]
    if result["meta"].get("kind") == "embed":  # `zenvllm bench --embed`'s own document
        return embed_check.problems(out_dir, result, expect or [], compare_csv, png_size)
    meta, w = result["meta"], result["meta"]["workload"]
    names = [c["name"] for c in result["configurations"]]
    problems += [f"failed: {f}" for f in meta["failures"]]
    problems += missing_configs(result["configurations"], expect or [])
    runs = result["runs"]
    summary = {s["config"]: s for s in result["summary"]}
    for name in names:
        mine = [r for r in runs if r["config"] == name]
        problems += config_problems(name, mine, summary.get(name), w)
    problems += ratio_problems(summary)
    problems += backend_problems(result["configurations"])
    try:
        derived = recompute.derive(result)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
        return [*problems, f"results.json: its figures cannot be derived again ({err!r})"]
    problems += recompute.problems(result, derived)
    if "peers" in result:  # documents written before the peers table have none
        problems += peer_problems(result["peers"], summary, result["configurations"])
    problems += weights_problems(result.get("weights", []), summary, result["configurations"])
    every_run = [*runs, *result.get("batch1", [])]
    problems += compare_csv(out_dir / "runs.csv", every_run, "runs.csv")
    problems += compare_csv(out_dir / "summary.csv", result["summary"], "summary.csv")
    problems += table_problems(out_dir / "table.md", summary, result.get("peers", []))
    problems += shown_problems(out_dir / "table.md", result, derived)
    problems += plot_problems(out_dir)
    return problems


def backend_problems(configurations: list[dict[str, Any]]) -> list[str]:
    """A configuration whose acceleration did not run is not what its name says."""
    return [
        f"{c['name']}: its {c['target']} acceleration did not run (platform "
        f"{c['backend']['platform']}, {c['backend']['accelerated_calls']} calls of its "
        "operators): not a measurement of that target"
        for c in configurations
        if c.get("backend", {}).get("active") is False
    ]


def missing_configs(configurations: list[dict[str, Any]], expect: list[str]) -> list[str]:
    """An expected configuration counts as run when it ran or was folded into one that did."""
    names = [c["name"] for c in configurations]
    problems = []
    for name in expect:
        folded = any(name in c["same_as"] for c in configurations)
        if name not in names and not folded:
            problems.append(f"configuration {name} is missing")
    return problems


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
    path: Path, summary: dict[str, dict[str, Any]], peers: list[dict[str, Any]]
) -> list[str]:
    """table.md is what people read: it must show each row's name, throughput and ratio,
    and each peer's quotients."""
    table = gate.read_text(path, gate.DOCUMENT, "run the bench again", optional=True) or ""
    problems = []
    for r in peers:
        row = f"| {r['peer']} | {r['output']:.3f}x | {r['ttft']:.3f}x | {r['tpot']:.3f}x |"
        if row not in table:
            problems.append(f"table.md lacks the peer row {row!r}")
    for s in summary.values():
        for text in (f"| {s['config']}", f"{s['output_tok_s']:g}", f"{s['ratio']:.3f}x"):
            if s["ratio"] is not None and text not in table:
                problems.append(f"table.md lacks {text!r} for {s['config']}")
    return problems


def shown_problems(path: Path, result: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    """The verdict in words as the runs give it (a document from before the peers
    table, with its verdict's keys only), the batch-1 rows, the weights and roofline
    rows, as the report writes them."""
    table = gate.read_text(path, gate.DOCUMENT, "run the bench again", optional=True) or ""
    rows = result.get("roofline", [])
    verdict = derived["verdict"]
    if "peers" not in result:
        verdict = {k: v for k, v in verdict.items() if k in result["verdict"]}
    wanted = [("verdict line", line) for line in verdict_lines(verdict)]
    wanted += [("weights row", weights_row(r)) for r in result.get("weights", [])]
    wanted += [("roofline row", roofline_row(r, has_batch1(rows))) for r in rows]
    wanted += [
        ("batch-1 row", batch1_row(Summary(**s)))
        for s in result["summary"]
        if s.get("batch1_tpot_ms") is not None
    ]
    return [f"table.md lacks the {kind} {text!r}" for kind, text in wanted if text not in table]


def plot_problems(out_dir: Path) -> list[str]:
    """A plot that failed can leave an empty or truncated file behind; read its header."""
    problems = []
    for png in ("throughput.png", "latency.png"):
        size = png_size(out_dir / png)
        if not size or min(size) < 100:
            problems.append(f"{png}: missing or not a PNG image ({size})")
    return problems


def compare_csv(path: Path, rows: list[dict[str, Any]], label: str) -> list[str]:
    try:
        text = gate.read_text(path, gate.DOCUMENT, "run the bench again")
    except gate.InputError as err:
        return [f"{label}: {err}"]
    got = list(csv.DictReader(io.StringIO(text, newline="")))
    if len(got) != len(rows):
        return [f"{label}: {len(got)} rows, results.json has {len(rows)}"]
    return [
        f"{label} row {i + 1} {key}: {g.get(key)!r} but results.json says {want!r}"
        for i, (g, row) in enumerate(zip(got, rows, strict=True))
        for key, want in row.items()
        if not same(g.get(key), want)
    ]


def embedding(out_dir: Path) -> bool:
    result = gate.read_json(out_dir / "results.json", gate.DOCUMENT, "")
    return bool(result["meta"].get("kind") == "embed")


def main(argv: list[str] | None = None) -> int:
    """`python -m zenvllm.bench.check DIR [--acceptance]`: check a bench output directory."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m zenvllm.bench.check", description=main.__doc__)
    parser.add_argument("out", type=Path, help="a `zenvllm bench --out` directory")
    parser.add_argument(
        "--acceptance",
        action="store_true",
        help=f"also require the planner's layout at >= {ACCEPTANCE_RATIO}x stock",
    )
    parser.add_argument(
        "--near-best",
        action="store_true",
        help=f"also require the planner's layout at >= {NEAR_BEST}x the best configuration "
        "that serves the same weights",
    )
    args = parser.parse_args(argv)
    problems = check_outputs(args.out)
    verdict_ = {}
    if not problems and embedding(args.out):
        print(f"{args.out}: complete and consistent (embeddings)")
        return 0
    if not problems:  # the verdict the runs give (check_outputs found the stored one equal)
        result = gate.read_json(args.out / "results.json", gate.DOCUMENT, "")
        verdict_ = recompute.derive(result)["verdict"]
        if args.acceptance and not verdict_["meets_acceptance"]:
            problems.append(
                f"the planner's layout ({verdict_['planner']}) made {verdict_['planner_ratio']}x "
                f"stock output throughput, under the {ACCEPTANCE_RATIO}x acceptance"
            )
        if args.near_best and not verdict_.get("near_best"):
            problems.append(
                f"the planner's layout ({verdict_['planner']}) made "
                f"{verdict_.get('planner_vs_best')}x of the best that serves the same weights "
                f"({verdict_.get('best_same_weights')}), under {NEAR_BEST}x"
            )
    for p in problems:
        print(f"{args.out}: {p}")
    if not problems:
        print(f"{args.out}: complete and consistent; planner {verdict_['planner_ratio']}x stock")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
