"""A generating model's quality beside its speed, pure: each configuration's raw quality
row (what its first server scored: bench/generation.py through bench/quality.py) judged
against the float32 reference's (the reference-f32 configuration, or stock where it
serves float32) within its format's bound (core/quality.py's BOUNDS), as the document's
`quality` rows; which configurations are beyond their bound (never the best, never the
planner's choice: bench/document.py's verdict); how table.md shows them; what fails
bench/check.py (a layout of the planner's beyond its bound).
"""

from __future__ import annotations

from typing import Any

from zenvllm.bench.catalogue import REFERENCE, STOCK
from zenvllm.core import quality

COLUMNS = (
    "config",
    "format",
    "perplexity",
    "reference",
    "gap",
    "bound",
    "within",
    "greedy_agreement",
    "note",
)


def reference_of(raw: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The reference's raw row: reference-f32's, else stock's where stock served float32."""
    by_name = {r["config"]: r for r in raw}
    ref = by_name.get(REFERENCE)
    if ref is None and by_name.get(STOCK, {}).get("format") == "float32":
        ref = by_name[STOCK]
    return ref if ref is not None and ref.get("perplexity") is not None else None


def judged_row(row: dict[str, Any], ref: dict[str, Any] | None) -> dict[str, Any]:
    """One configuration's quality row: its perplexity against the reference's, the gap
    within its format's bound or beyond it, and the share of the reference's greedy
    tokens its own match; unjudged (None) with the reason where it cannot be."""
    out: dict[str, Any] = {k: None for k in COLUMNS}
    out |= {"config": row["config"], "format": row["format"], "note": row.get("note", "")}
    measured = row.get("perplexity")
    if measured is None:
        return out
    out["perplexity"] = measured
    if ref is None:
        return out | {"note": "not judged: no float32 reference was measured"}
    if row["format"] not in quality.BOUNDS:
        return out | {"note": f"not judged: no quality bound for format {row['format']!r}"}
    judged = quality.judge(row["format"], measured, ref["perplexity"])
    agreement = (
        round(quality.greedy_agreement(row.get("greedy", []), ref["greedy"]), 4)
        if ref.get("greedy")
        else None
    )
    return out | {
        "reference": ref["perplexity"],
        "gap": round(judged.gap, 6),
        "bound": judged.bound,
        "within": judged.within,
        "greedy_agreement": agreement,
    }


def judged_rows(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The document's `quality` rows from its raw `quality_runs`, in their order."""
    ref = reference_of(raw)
    return [judged_row(r, ref) for r in raw]


def beyond(rows: list[dict[str, Any]]) -> set[str]:
    """The configurations beyond their format's bound."""
    return {r["config"] for r in rows if r["within"] is False}


def cell(row: dict[str, Any] | None) -> str:
    """A configuration's quality in the detail table, beside its tokens/s."""
    if row is None:
        return "-"
    if row["within"] is None:
        return "not judged" if row["perplexity"] is not None else "not measured"
    agree = f", {row['greedy_agreement']:.0%} agree" if row["greedy_agreement"] is not None else ""
    return f"{'BEYOND ' if not row['within'] else ''}{row['gap']:+.2%}{agree}"


def line(row: dict[str, Any]) -> str:
    """A configuration's row in table.md's quality table (bench/check.py looks for it)."""
    if row["perplexity"] is None or row["within"] is None:
        ppl = f"{row['perplexity']:.4f}" if row["perplexity"] is not None else "-"
        return f"| {row['config']} | {row['format']} | {ppl} | - | - | - | {row['note']} |"
    agree = f"{row['greedy_agreement']:.1%}" if row["greedy_agreement"] is not None else "-"
    verdict = "within" if row["within"] else "**BEYOND**"
    return (
        f"| {row['config']} | {row['format']} | {row['perplexity']:.4f} | {row['gap']:+.2%} "
        f"| {row['bound']:.1%} | {agree} | {verdict} |"
    )


def table(rows: list[dict[str, Any]]) -> str:
    """table.md's quality table: every configuration against the float32 reference."""
    lines = [
        "Quality against the float32 reference, asked of each configuration's first server "
        f"(perplexity of held-out text; the share of {quality.GREEDY_TOKENS} greedy tokens "
        "that match the reference's; bounds per format in core/quality.py). A "
        "configuration BEYOND its bound is left out of the best and never the planner's:",
        "",
        "| configuration | format | perplexity | gap | bound | greedy agreement | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    return "\n".join(lines + [line(r) for r in rows])


def planner_problems(rows: list[dict[str, Any]], configs: list[dict[str, Any]]) -> list[str]:
    """A layout of the planner's (kind plan: what zenvllm deploys) beyond its bound fails
    the check, by name and numbers; a peer beyond its bound is marked only."""
    planned = {c["name"] for c in configs if c["kind"] == "plan"}
    return [
        f"{r['config']}: quality beyond its bound: "
        + quality.judge(r["format"], r["perplexity"], r["reference"]).said()
        + (
            f"; greedy agreement {r['greedy_agreement']:.1%}"
            if r["greedy_agreement"] is not None
            else ""
        )
        for r in rows
        if r["within"] is False and r["config"] in planned
    ]
