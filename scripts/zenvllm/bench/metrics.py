"""A bench result as Prometheus gauges, beside the fleet's own metrics.

`zenvllm bench --metrics-file /var/lib/prometheus/node-exporter/zenvllm_bench.prom`
writes the file the node exporter's textfile collector serves (Debian's default
directory), so the monitoring role's Prometheus scrapes the run next to vLLM's
live metrics. The file is replaced in one rename; one zenvllm did not write is
refused.
"""

from __future__ import annotations

import calendar
import os
import time
from pathlib import Path
from typing import Any

from zenvllm.core import gate
from zenvllm.core.errors import UserError

HEADER = "# zenvllm bench results (zenvllm bench --metrics-file)\n"
# (metric, Summary field, help)
GAUGES = (
    ("output_tokens_per_second", "output_tok_s", "Median output tokens/s of the configuration."),
    ("total_tokens_per_second", "total_tok_s", "Median prompt+output tokens/s."),
    ("ttft_seconds", "ttft_ms", "Median time to first token."),
    ("tpot_seconds", "tpot_ms", "Median time per output token."),
    ("ratio_to_stock", "ratio", "Output tokens/s over stock vLLM's, measured in the same run."),
    ("batch1_ttft_seconds", "batch1_ttft_ms", "Time to first token, one request at a time."),
    ("batch1_tpot_seconds", "batch1_tpot_ms", "Time per output token, one request at a time."),
)


def label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(result: dict[str, Any]) -> str:
    """The result's summaries in Prometheus' text format, one series per configuration."""
    meta = result["meta"]
    common = f'model="{label(meta["model"])}",run_id="{label(str(meta["run_id"]))}"'
    lines = [HEADER.rstrip("\n")]
    for name, field, text in GAUGES:
        metric = f"zenvllm_bench_{name}"
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} gauge"]
        for summary in result["summary"]:
            value = summary.get(field)  # documents before batch 1 have none
            if value is None:
                continue
            if field.endswith("_ms"):
                value = value / 1000
            lines.append(f'{metric}{{{common},config="{label(summary["config"])}"}} {value:g}')
    stamp = calendar.timegm(time.strptime(meta["date"], "%Y-%m-%dT%H:%M:%SZ"))
    lines += [
        "# HELP zenvllm_bench_timestamp_seconds When the run started (Unix time).",
        "# TYPE zenvllm_bench_timestamp_seconds gauge",
        f"zenvllm_bench_timestamp_seconds{{{common}}} {stamp}",
    ]
    return "\n".join(lines) + "\n"


def check_metrics_file(path: Path) -> None:
    """Before any work: a directory that exists, and no file of someone else's."""
    if not path.parent.is_dir():
        raise UserError(
            f"--metrics-file {path}: {path.parent} is not a directory; create it or give the "
            "node exporter's textfile directory (Debian: /var/lib/prometheus/node-exporter)"
        )
    if path.is_symlink() or path.is_dir():
        raise UserError(f"--metrics-file {path}: not a plain file; give a new file name")
    if path.exists():
        try:
            text = gate.read_text(path, gate.SMALL, "give a new file name") or ""
        except gate.InputError as err:
            raise UserError(f"--metrics-file {err}") from None
        if text.splitlines(keepends=True)[:1] != [HEADER]:
            raise UserError(
                f"--metrics-file {path}: this file was not written by zenvllm bench and stays; "
                "give a new file name"
            )


def write_metrics_file(path: Path, result: dict[str, Any]) -> None:
    """Replace the file in one rename (the collector never reads half of it)."""
    check_metrics_file(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(exposition(result))
        tmp.chmod(0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
