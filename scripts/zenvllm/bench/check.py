"""Is a bench output directory complete and consistent? One check for every model kind.

`python -m zenvllm.bench.check DIR [--acceptance] [--near-best] [--agrees-with OTHER]`:
no configuration failed or is missing; the runs are what the workload asked of every
configuration and every derived figure follows from the raw runs (the document's kind,
bench/kinds.py, checks its own: a generating model's in bench/recompute.py, which
trusts no stored verdict, its quality verdicts included, and fails a layout of the
planner's beyond its quality bound; a pooling model's in bench/pooling.py); the CSVs
(quality.csv too) and the table say what results.json says; the plots are PNGs. With
--agrees-with, two runs of the same configurations agree on each one's ratio to stock
(bench/agreement.py).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from zenvllm.bench import agreement, kinds
from zenvllm.bench.catalogue import ACCEPTANCE_RATIO, NEAR_BEST
from zenvllm.core import gate
from zenvllm.core.errors import UserError

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

    Empty means: no configuration failed and every one expected ran (or was folded into
    one that did); its kind's runs are what the workload asked and its derived figures
    what the runs give (bench/kinds.py); the CSVs say what the JSON says, the table
    shows them, and the plots are real PNGs."""
    try:
        result = gate.read_json(out_dir / "results.json", gate.DOCUMENT, "run the bench again")
        kind = kinds.of_document(result)
    except (gate.InputError, UserError) as err:
        return [f"results.json: {err}"]
    problems = [f"failed: {f}" for f in result["meta"]["failures"]]
    problems += missing_configs(result["configurations"], expect or [])
    problems += kind.problems(result)
    try:
        problems += kind.derived_problems(result)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
        return [*problems, f"results.json: its figures cannot be derived again ({err!r})"]
    raw = [r for key in kind.raw for r in result.get(key, [])]
    problems += compare_csv(out_dir / "runs.csv", raw, "runs.csv")
    problems += compare_csv(out_dir / "summary.csv", result["summary"], "summary.csv")
    if result.get("quality"):
        problems += compare_csv(out_dir / "quality.csv", result["quality"], "quality.csv")
    table = gate.read_text(out_dir / "table.md", gate.DOCUMENT, "run the bench again", True)
    problems += kind.table_problems(result, table or "")
    return problems + plot_problems(out_dir, kind.plot_files)


def missing_configs(configurations: list[dict[str, Any]], expect: list[str]) -> list[str]:
    """An expected configuration counts as run when it ran or was folded into one that did."""
    names = [c["name"] for c in configurations]
    problems = []
    for name in expect:
        folded = any(name in c["same_as"] for c in configurations)
        if name not in names and not folded:
            problems.append(f"configuration {name} is missing")
    return problems


def plot_problems(out_dir: Path, names: tuple[str, ...]) -> list[str]:
    """A plot that failed can leave an empty or truncated file behind; read its header."""
    problems = []
    for png in names:
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


def main(argv: list[str] | None = None) -> int:
    """`python -m zenvllm.bench.check DIR [--acceptance] [--near-best] [--agrees-with
    OTHER]`: check a bench output directory."""
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
    parser.add_argument(
        "--agrees-with",
        type=Path,
        metavar="OTHER",
        help="also require that no configuration's ratio to stock differs from OTHER's beyond "
        "their repeats' noise (OTHER: a run of the same configurations, in another order; "
        "3 repeats or more each)",
    )
    args = parser.parse_args(argv)
    problems = check_outputs(args.out)
    if args.agrees_with:
        problems += [f"{args.agrees_with}: {p}" for p in check_outputs(args.agrees_with)]
    said = ""
    if not problems:  # judged as its kind judges it (the verdict the runs give)
        result = gate.read_json(args.out / "results.json", gate.DOCUMENT, "")
        problems, said = kinds.of_document(result).judged(result, args.acceptance, args.near_best)
        if args.agrees_with and not problems:
            other = gate.read_json(args.agrees_with / "results.json", gate.DOCUMENT, "")
            problems = agreement.disagreements(result, other)
            said += f"\n{args.out}: {agreement.agreement_line(result, other)}"
    for p in problems:
        print(f"{args.out}: {p}")
    if not problems:
        print(f"{args.out}: {said}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
