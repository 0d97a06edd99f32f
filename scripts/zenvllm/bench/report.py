"""The report: a result document as files, for every model kind (bench/kinds.py).

results.json (the document), runs.csv (its raw rows: a generating model's throughput
repeats then batch 1's; a pooling model's repeats at each batch size), summary.csv,
quality.csv (a generating model's quality rows, bench/scored.py),
table.md (its kind's tables, bench/tables.py) and its kind's PNG plots
(bench/plots.py; matplotlib is imported only when plotting).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zenvllm.bench import kinds, scored


def rows_csv(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
    """Rows as CSV, a column per field (None as an empty cell)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(names), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def markdown(result: dict[str, Any]) -> str:
    """table.md: the tables of the document's kind."""
    return kinds.of_document(result).markdown(result)


def write_outputs(result: dict[str, Any], out_dir: Path, plots: bool = True) -> list[Path]:
    """results.json, runs.csv, summary.csv, quality.csv, table.md and the PNGs into out_dir."""
    kind = kinds.of_document(result)
    raw = [r for key in kind.raw for r in result.get(key, [])]
    files = {
        "results.json": json.dumps(result, indent=2) + "\n",
        "runs.csv": rows_csv(raw, kind.run_columns),
        "summary.csv": rows_csv(result["summary"], kind.summary_columns),
        "table.md": kind.markdown(result),
    }
    if result.get("quality"):  # a generating model's, where it was measured
        files["quality.csv"] = rows_csv(result["quality"], scored.COLUMNS)
    written = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    if plots and result["summary"]:
        written += kind.plot(result, out_dir)
    return written
