"""Predicted against measured, pure: each configuration of a generating model's run set
beside what the performance model (core/performance.py) predicts for it at the run's
workload, so every bench run checks the model (issue 66).

The model's inputs come from the document alone, so bench/check.py derives the rows
again: the bandwidth the run measured (meta, as the roofline's), the CPU's flags and
generation and the model's FLOPs and KV bytes per token (meta, recorded by the bench:
`meta_of`), each configuration's cores and weight bytes (its servers). The bench's
clients start together and run the same lengths, so its TPOT is one decode step at the
batch (Prediction.step_ms) and its TTFT waits for every prompt of the wave; the output
tokens/s is the model's own. The planner's layout (auto) fails the run when its output
tokens/s is off the prediction by more than the model's ERROR_BOUND; the others are
reported. A model whose weights fit in the host's L3 caches is not memory-bound (the
test tier's tiny and trained models), so its prediction is shown, not checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from zenvllm.bench.catalogue import PLANNER, REFERENCE_KIND, SPECS
from zenvllm.bench.layouts import Configuration, cpu_ids
from zenvllm.bench.results import Summary
from zenvllm.core import performance
from zenvllm.core.dtype import NATIVE_BF16_FLAGS
from zenvllm.core.host import Host
from zenvllm.core.model import DTYPE_BYTES, Model
from zenvllm.core.performance import Layout, Load, Machine, Shape

# The flags compute_of reads (and the vector width, for the reader): recorded in meta.
COMPUTE_FLAGS = (*NATIVE_BF16_FLAGS, "avx512f", "avx2")
LLAMACPP = "llama.cpp's own engine and scheduler, not vLLM's"


def meta_of(host: Host, model: Model, copies: Sequence[tuple[str, Model]]) -> dict[str, Any]:
    """What the model needs of a run beyond the roofline's meta: the CPU's compute (its
    flags and generation), --model's stored dtype and KV bytes per token, and each copy's
    FLOPs per token by its directory ("": --model's; a 4-bit copy's cost more a weight)."""
    flops = {"": performance.shape_of(model).flops_per_token}
    flops |= {path: performance.shape_of(copy).flops_per_token for path, copy in copies}
    return {
        "cpu_flags": sorted(f for f in host.flags if f in COMPUTE_FLAGS),
        "cpu_generation": host.generation,
        "model_dtype": model.dtype,
        "kv_bytes_per_token": model.kv_bytes_per_token or 0,
        "flops_per_token": flops,
    }


def served_dtype(config: Configuration, meta: dict[str, Any]) -> str:
    """vLLM's own command's --dtype (stock, the peers); a planner layout's is the plan's,
    or its catalogue entry's where it asks another (auto-stock-dtype). Documents written
    before servers said theirs: the run's stock and plan dtypes."""
    if config.servers[0].dtype:
        return config.servers[0].dtype
    if config.kind == "stock":
        return meta.get("stock_dtype") or "bfloat16"
    spec = SPECS.get(config.name)
    return (spec.dtype if spec else "") or meta.get("plan_dtype") or "bfloat16"


def why_not(config: Configuration, meta: dict[str, Any]) -> str:
    """Why the model gives no prediction for the configuration; "" when it does."""
    if config.kind == REFERENCE_KIND:
        return "the quality reference, scored only: no throughput runs"
    if not config.servers:
        return "nginx in front of the planner's instances: the model predicts them (auto)"
    if config.kind == "llamacpp":
        return LLAMACPP
    if any(s.speculation for s in config.servers):
        return "speculative decoding makes several tokens a step; the model counts one"
    if not meta.get("core_bandwidth_gbs") or not meta.get("host_cores"):
        return "the run measured no bandwidth"
    if "cpu_generation" not in meta:
        return "the run recorded no CPU flags (written before the bench did)"
    if (config.servers[0].model_dir or "") not in meta.get("flops_per_token", {}):
        return f"the run recorded no FLOPs per token for {config.servers[0].model_dir}"
    return ""


def shape_of(config: Configuration, meta: dict[str, Any]) -> Shape:
    """The copy a configuration serves, in the dtype it serves: its own bytes where its
    servers say them (another copy, or float32's), else --model's rescaled."""
    first = config.servers[0]
    stored = meta.get("model_dtype") or "bfloat16"  # the bench models' before it was recorded
    scale = DTYPE_BYTES.get(served_dtype(config, meta), 2) / DTYPE_BYTES.get(stored, 2)
    weights = first.weight_bytes or int(meta["weight_bytes"] * scale)
    kv = int(meta.get("kv_bytes_per_token", 0) * scale)
    return Shape(weights, meta["flops_per_token"][first.model_dir or ""], kv)


def layout_of(config: Configuration, host_cores: int) -> Layout:
    """Instances and OpenMP cores as the bench started them: vLLM's auto binding keeps
    one core of each container for its API server; tensor ranks are one instance over all
    their cores; pipeline stages take turns, each on its own cores."""
    if all(s.omp_bind == "auto" for s in config.servers):
        cpus = [host_cores if s.cpus == "all" else len(cpu_ids(s.cpus)) for s in config.servers]
        kept = max(1, min(cpus) - 1)
        return Layout(kept, len(cpus), streaming=kept * len(cpus))
    ranks = [r for s in config.servers for r in s.omp_bind.split("|")]
    cores = [len(cpu_ids(r)) for r in ranks]
    if config.kind == "tp":
        return Layout(sum(cores), streaming=sum(cores))
    if config.kind == "pp":
        return Layout(cores[0], stages=len(cores), streaming=cores[0])
    return Layout(min(cores), len(cores), streaming=sum(cores))


def machine_of(config: Configuration, meta: dict[str, Any]) -> Machine:
    compute = performance.compute_of(
        frozenset(meta["cpu_flags"]), meta["cpu_generation"], served_dtype(config, meta)
    )
    return Machine(
        meta["core_bandwidth_gbs"],
        compute,
        meta.get("bandwidth_source") or "",
        meta.get("core_alone_gbs") or 0.0,
        meta.get("node_cores") or meta["host_cores"],
    )


@dataclass(frozen=True)
class Inputs:
    shape: Shape
    machine: Machine
    layout: Layout
    load: Load


def inputs_of(config: Configuration, meta: dict[str, Any]) -> Inputs:
    """The model's inputs for a configuration it describes (why_not gives "")."""
    w = meta["workload"]
    return Inputs(
        shape_of(config, meta),
        machine_of(config, meta),
        layout_of(config, meta["host_cores"]),
        Load(w["input_len"], w["output_len"], concurrency=w["concurrency"]),
    )


def bench_figures(i: Inputs) -> tuple[float, float, float]:
    """(output tok/s, TPOT ms, TTFT ms) as the bench measures them: its clients start
    together, so each request's tokens wait for no other prompt (TPOT is the step) and
    its first token for every prompt of its instance's wave (vLLM prefills them before
    decoding)."""
    batch = i.load.concurrency / i.layout.instances
    at = performance.predict(i.shape, i.machine, i.layout, i.load, batch)
    prefill_ms = 1000 * performance.prefill_s(i.shape, i.machine, i.layout, i.load.prompt)
    return at.output_tok_s, at.step_ms, batch * prefill_ms + at.step_ms


def quotient(measured: float | None, predicted: float) -> float | None:
    return round(measured / predicted, 3) if measured and predicted > 0 else None


FIGURES = ("output_tok_s", "tpot_ms", "ttft_ms")


def row(config: Configuration, s: Summary | None, meta: dict[str, Any]) -> dict[str, Any]:
    """One configuration's row: predicted, measured and measured / predicted for each
    figure; `within` the model's bound (None: not checked) and a note saying why not."""
    measured = {f: getattr(s, f) if s else None for f in FIGURES}
    r: dict[str, Any] = {"config": config.name}
    why = why_not(config, meta)
    if why:
        for f in FIGURES:
            r |= {f"predicted_{f}": None, f: measured[f], f"{f}_ratio": None}
        return r | {"within": None, "note": f"not predicted: {why}"}
    inputs = inputs_of(config, meta)
    # Rounded as shown, so each ratio and the check are the quotient of the numbers beside them.
    predicted = [round(p, 1) for p in bench_figures(inputs)]
    for f, p in zip(FIGURES, predicted, strict=True):
        r |= {f"predicted_{f}": p, f: measured[f], f"{f}_ratio": quotient(measured[f], p)}
    l3 = meta.get("l3_bytes") or 0
    if inputs.shape.weight_bytes <= l3:
        note = (
            f"not checked: its {inputs.shape.weight_bytes / 1e6:.1f} MB of weights fit in the "
            f"host's L3 caches ({l3 / 1e6:.1f} MB), so its steps are not memory-bound"
        )
        return r | {"within": None, "note": note}
    if not measured["output_tok_s"]:
        return r | {"within": None, "note": "not checked: not measured"}
    if abs(predicted[0] / measured["output_tok_s"] - 1) <= performance.ERROR_BOUND:
        return r | {"within": True, "note": ""}  # as ERROR_BOUND is defined
    low = lowest_figure(meta)
    if low is None:
        return r | {"within": False, "note": ""}
    at_low = round(bench_figures(inputs_at(inputs, low / meta["core_bandwidth_gbs"]))[0], 1)
    within = spans(at_low, predicted[0], measured["output_tok_s"])
    note = (
        f"within ±{performance.ERROR_BOUND:.0%} of {at_low:g} predicted from the run's lower "
        f"figure ({low:g} GB/s per core): the machine changed during the run"
    )
    return r | {
        "predicted_output_tok_s_low": at_low,
        "within": within,
        "note": note if within else "",
    }


def lowest_figure(meta: dict[str, Any]) -> float | None:
    """The lower copy figure the run measured, at its start or its end, when it is below
    the run's own (the higher, bench/bandwidth.run_figures); else None."""
    figure = meta["core_bandwidth_gbs"]
    others = [meta.get(k) or 0.0 for k in ("bandwidth_start_gbs", "bandwidth_end_gbs")]
    low = min([o for o in others if o > 0], default=figure)
    return low if low < figure else None


def inputs_at(i: Inputs, scale: float) -> Inputs:
    """The same inputs on the machine as its lower figure saw it: every bandwidth scaled."""
    m = i.machine
    machine = replace(m, core_gbs=m.core_gbs * scale, core_alone_gbs=m.core_alone_gbs * scale)
    return Inputs(i.shape, machine, i.layout, i.load)


def spans(a: float, b: float, measured: float) -> bool:
    """Whether some prediction between a and b (the run's two figures bound it: output
    tok/s grows with the bandwidth) is within the model's bound of what was measured."""
    lo, hi = sorted((a, b))
    bound = performance.ERROR_BOUND
    return lo <= measured * (1 + bound) and hi >= measured * (1 - bound)


def predictions(
    summaries: list[Summary], configs: list[Configuration], meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """A row per configuration of the run, in its order (the model covers it or says why
    not)."""
    by_name = {s.config: s for s in summaries}
    return [row(c, by_name.get(c.name), meta) for c in configs]


def planner_problems(rows: list[dict[str, Any]]) -> list[str]:
    """The planner's layout off its prediction by more than the model's bound fails the
    run, its numbers named; a peer off it is reported in the table only."""
    return [
        f"{r['config']}: predicted {r['predicted_output_tok_s']:g} output tok/s "
        f"(TPOT {r['predicted_tpot_ms']:g} ms), measured {r['output_tok_s']:g} (TPOT "
        f"{r['tpot_ms']:g} ms): off by {r['predicted_output_tok_s'] / r['output_tok_s'] - 1:+.1%},"
        f" beyond the performance model's bound of {performance.ERROR_BOUND:.0%} "
        "(core/performance.py): the model or the run's bandwidth figure is wrong"
        for r in rows
        if r["config"] == PLANNER and r["within"] is False
    ]


# -- the table ----------------------------------------------------------------------------


def cells(r: dict[str, Any], figure: str) -> list[str]:
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:g}"

    ratio = r[f"{figure}_ratio"]
    return [
        num(r[f"predicted_{figure}"]),
        num(r[figure]),
        "-" if ratio is None else f"{ratio:.3f}x",
    ]


def verdict_cell(r: dict[str, Any]) -> str:
    if r["within"] is None or r["note"]:  # not checked, or within at the lower figure
        return str(r["note"])
    within = "within" if r["within"] else "BEYOND"
    return f"{within} ±{performance.ERROR_BOUND:.0%}"


def prediction_row(r: dict[str, Any]) -> str:
    """One row of the table (check.py looks for it in table.md)."""
    shown = [r["config"], *(c for f in FIGURES for c in cells(r, f)), verdict_cell(r)]
    return "| " + " | ".join(shown) + " |"


def predictions_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "Predicted against measured: core/performance.py from this run's bandwidth, its "
        "CPU's compute and its workload (TPOT: one decode step at the batch; TTFT: the "
        f"wave's prompts, then a step); ratio = measured / predicted. The model's bound is "
        f"±{performance.ERROR_BOUND:.0%} on output tok/s: {PLANNER} beyond it fails the run "
        "(bench/check.py), the others are reported.",
        "",
        "| configuration | output tok/s predicted | measured | ratio | TPOT ms predicted "
        "| measured | ratio | TTFT ms predicted | measured | ratio | against the bound |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    return "\n".join([*lines, *(prediction_row(r) for r in rows)])
