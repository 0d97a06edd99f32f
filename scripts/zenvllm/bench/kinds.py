"""The model kinds the one bench measures, and which kind a model or a result is.

A generating model and a pooling (embedding) model are benched by one command, one
runner (bench/runner.py), into one result format (bench/document.py: meta with its
kind, the configurations, the raw runs, what is derived from them), written by one
report (bench/report.py) and checked by one check (bench/check.py). A Kind holds what
differs: how a run is prepared from the request (its configurations and workload), how
one configuration is measured and what its results say of the run, and how its
document is derived, tabled, plotted and checked (its metric, its report columns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic

from zenvllm.bench import document, flags, generation, plots, pooling, recompute, tables
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.measuring import Measured, Prepared, Settings, Stage
from zenvllm.bench.results import PoolingRun, PoolingSummary, Run, Summary
from zenvllm.bench.workloads import AnyWorkload, PoolingWorkload, Workload
from zenvllm.core.errors import UserError
from zenvllm.core.model import POOLING, Model

Document = dict[str, Any]


@dataclass(frozen=True)
class Kind(Generic[AnyWorkload]):
    """One model kind: what its bench does that another's does not."""

    name: str  # the document's meta.kind
    # -- the run
    prepare: Callable[[flags.BenchRequest, Path, Model], Prepared[AnyWorkload]]
    profiled: bool  # the planner's servers run vLLM's profiler (bench/backend.py reads back)
    measure: Callable[[Configuration, Stage[AnyWorkload]], Measured]
    meta: Callable[[Settings[AnyWorkload]], dict[str, Any]]  # beyond every run's meta
    # -- its document
    raw: tuple[str, ...]  # its raw rows' keys, in runs.csv's order
    run_columns: tuple[str, ...]  # runs.csv
    summary_columns: tuple[str, ...]  # summary.csv
    plot_files: tuple[str, ...]  # the PNGs its report writes
    derive: Callable[[Document], Document]  # what it derives from its raw rows
    markdown: Callable[[Document], str]  # table.md
    plot: Callable[[Document, Path], list[Path]]
    problems: Callable[[Document], list[str]]  # its runs against its stored rows
    derived_problems: Callable[[Document], list[str]]  # derived again (raises: cannot be)
    table_problems: Callable[[Document, str], list[str]]  # what table.md must show
    judged: Callable[[Document, bool, bool], tuple[list[str], str]]  # --acceptance, --near-best


def columns(row: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(row))


GENERATION_KIND: Kind[Workload] = Kind(
    name=document.GENERATION,
    prepare=generation.prepare,
    profiled=True,
    measure=generation.measure,
    meta=generation.meta,
    raw=("runs", "batch1"),  # the throughput repeats, then batch 1's
    run_columns=columns(Run),
    summary_columns=columns(Summary),
    plot_files=("throughput.png", "latency.png"),
    derive=document.derive,
    markdown=tables.generation_markdown,
    plot=plots.generation_plots,
    problems=recompute.generation_problems,
    derived_problems=recompute.generation_derived_problems,
    table_problems=recompute.generation_table_problems,
    judged=recompute.generation_judged,
)
POOLING_KIND: Kind[PoolingWorkload] = Kind(
    name=document.POOLING,
    prepare=pooling.prepare,
    profiled=False,
    measure=pooling.measure,
    meta=pooling.meta,
    raw=("runs",),
    run_columns=columns(PoolingRun),
    summary_columns=columns(PoolingSummary),
    plot_files=("throughput.png",),
    derive=document.derive_pooling,
    markdown=tables.pooling_markdown,
    plot=plots.pooling_plots,
    problems=pooling.pooling_problems,
    derived_problems=pooling.pooling_derived_problems,
    table_problems=pooling.pooling_table_problems,
    judged=pooling.pooling_judged,
)
KINDS: dict[str, Kind[Any]] = {k.name: k for k in (GENERATION_KIND, POOLING_KIND)}


def of_model(model: Model, embed: bool, model_dir: Path) -> Kind[Any]:
    """The kind a model is benched as: the one its runner names (core/model.py), a
    pooling model's; --embed asks for that kind and refuses a model of another."""
    if embed and model.runner != POOLING:
        raise UserError(f"--embed: {model_dir.name} is not an embedding model ({model.runner_why})")
    return POOLING_KIND if model.runner == POOLING else GENERATION_KIND


def of_document(result: Document) -> Kind[Any]:
    """The kind a result document is of: its meta.kind (none: a generating model's,
    written before documents said)."""
    name = result["meta"].get("kind", document.GENERATION)
    if name not in KINDS:
        raise UserError(f"meta.kind {name!r} is none of the bench's kinds ({', '.join(KINDS)})")
    return KINDS[name]
