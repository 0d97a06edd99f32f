"""Is an embedding bench's output directory complete and consistent?

`python -m zenvllm.bench.check DIR` hands a directory whose results.json says
`meta.kind: embed` here. Every configuration ran every repeat at every batch size with
every request answered and every input counted; each rate is the quotient of the
numbers beside it; every configuration was sent the very same inputs (the same token
counts, repeat by repeat); the summary, the planner's quotients and the best per batch
size are derived again from the runs (nothing stored is trusted); the CSVs say what
the JSON says, the table shows every row, the vectors agree with stock's, the plot is
a PNG.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zenvllm.bench import document
from zenvllm.bench.embed_report import detail_row, planner_row
from zenvllm.bench.embed_results import EmbedRun, EmbedSummary, derived
from zenvllm.bench.recompute import close
from zenvllm.core import gate

# A vector of the same model, in bfloat16 against float32: 0.9999 and up (tests/serve).
SAME_VECTOR = 0.999
# The random inputs re-tokenize to within a token or so of input_len: 2% is a lot.
TOKENS_SLACK = 0.02


def run_problems(r: dict[str, Any], w: dict[str, Any]) -> list[str]:
    """A run that lost a request or an input, or whose rate does not follow."""
    name = f"{r['config']} batch {r['batch']} repeat {r['repeat']}"
    problems = []
    if r["failed"] or r["requests"] != w["inputs"] // r["batch"] or r["inputs"] != w["inputs"]:
        problems.append(
            f"{name}: {r['requests']} requests ({r['inputs']} inputs) completed, "
            f"{r['failed']} failed, of {w['inputs'] // r['batch']} ({w['inputs']} inputs)"
        )
    expected = w["inputs"] * w["input_len"]
    if abs(r["input_tokens"] - expected) > TOKENS_SLACK * expected:
        problems.append(f"{name}: {r['input_tokens']} input tokens, expected about {expected}")
    for key, top in (("inputs_s", "inputs"), ("tokens_s", "input_tokens")):
        rate = r[top] / r["window_s"]
        if abs(rate - r[key]) > 0.05 + 1e-4 * rate:
            problems.append(f"{name}: {key} {r[key]} is not {top} / window_s = {rate:.2f}")
    return problems


def coverage_problems(result: dict[str, Any]) -> list[str]:
    """Every configuration, every batch size, every repeat: once each."""
    w = result["meta"]["workload"]
    seen: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r in result["runs"]:
        seen[r["config"], r["batch"]].append(r["repeat"])
    return [
        f"{c['name']} batch {b}: repeats {sorted(seen[c['name'], b])}, expected 1 to {w['repeats']}"
        for c in result["configurations"]
        for b in w["batch_sizes"]
        if sorted(seen[c["name"], b]) != list(range(1, w["repeats"] + 1))
    ]


def same_inputs_problems(runs: list[dict[str, Any]]) -> list[str]:
    """Each repeat's inputs are drawn once for every configuration: the servers must
    have counted the same tokens (a server that truncated or counted otherwise differs)."""
    tokens: dict[tuple[int, int], dict[str, int]] = defaultdict(dict)
    for r in runs:
        tokens[r["batch"], r["repeat"]][r["config"]] = r["input_tokens"]
    return [
        f"batch {b} repeat {n}: the configurations counted different input tokens {counts}"
        for (b, n), counts in sorted(tokens.items())
        if len(set(counts.values())) > 1
    ]


def derived_problems(result: dict[str, Any]) -> list[str]:
    """The summary, the planner's quotients and the best per batch size, derived again."""
    configs = document.configs_from_dicts(result["configurations"])
    again = derived(configs, [EmbedRun(**r) for r in result["runs"]])
    problems = []
    for key in ("summary", "planner_over", "best"):
        stored, want = result.get(key), again[key]
        if isinstance(want, dict) or not isinstance(stored, list):
            same = stored == want
        else:
            same = len(stored) == len(want) and all(
                a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
                for a, b in zip(stored, want, strict=True)
            )
        if not same:
            problems.append(f"{key}: not what the runs give ({want!r})")
    return problems


def shown_problems(out_dir: Path, result: dict[str, Any]) -> list[str]:
    """table.md shows every summary row and every quotient of the planner's."""
    table = gate.read_text(out_dir / "table.md", gate.DOCUMENT, "run the bench again", True)
    wanted = [detail_row(EmbedSummary(**s)) for s in result["summary"]]
    wanted += [planner_row(r) for r in result["planner_over"]]
    return [f"table.md lacks the row {row!r}" for row in wanted if row not in (table or "")]


def vector_problems(configurations: list[dict[str, Any]]) -> list[str]:
    return [
        f"{c['name']}: its vector's cosine to stock's is {c['cosine_to_stock']}, under "
        f"{SAME_VECTOR}: not the same model"
        for c in configurations
        if c.get("cosine_to_stock") is not None and c["cosine_to_stock"] < SAME_VECTOR
    ]


CsvCheck = Callable[[Path, list[dict[str, Any]], str], list[str]]


def problems(
    out_dir: Path,
    result: dict[str, Any],
    expect: list[str],
    compare_csv: CsvCheck,
    png_size: Callable[[Path], tuple[int, int] | None],
) -> list[str]:
    """Every way an embedding bench directory is incomplete or inconsistent; the CSV
    and PNG checks are bench/check.py's, which calls this."""
    meta, w = result["meta"], result["meta"]["workload"]
    names = {c["name"] for c in result["configurations"]}
    found = [f"failed: {f}" for f in meta["failures"]]
    found += [f"configuration {n} is missing" for n in expect if n not in names]
    found += coverage_problems(result)
    for r in result["runs"]:
        found += run_problems(r, w)
    found += same_inputs_problems(result["runs"])
    try:
        found += derived_problems(result)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
        return [*found, f"results.json: its figures cannot be derived again ({err!r})"]
    found += vector_problems(result["configurations"])
    found += compare_csv(out_dir / "runs.csv", result["runs"], "runs.csv")
    found += compare_csv(out_dir / "summary.csv", result["summary"], "summary.csv")
    found += shown_problems(out_dir, result)
    size = png_size(out_dir / "throughput.png")
    if not size or min(size) < 100:
        found.append(f"throughput.png: missing or not a PNG image ({size})")
    return found
