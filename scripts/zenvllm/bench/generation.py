"""The generating model's kind of bench: what differs from a pooling model's.

Its preparation from the request: the served length, the workload (prompts of a length,
output tokens, batch 1), the configurations of its catalogue on this host (other copies
of the weights with --weights, the llama.cpp peers where the weights are bf16, the
roofline's bandwidth measured). Its measurement of one configuration, servers ready:
a warm-up, the repeats and batch 1 with vLLM's own `vllm bench serve`, its quality
through its first server (bench/quality.py; the float32 reference's only, first), then
what ran, read back from the first server (bench/backend.py). Its meta: the dtypes, the
--serve-env, the roofline's figures, the performance model's inputs. bench/kinds.py puts
it beside its figures.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

from zenvllm.bench import (
    backend,
    bandwidth,
    catalogue,
    clients,
    flags,
    layouts,
    predicted,
    quality,
    results,
)
from zenvllm.bench.catalogue import REFERENCE, REFERENCE_KIND, STOCK
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.measuring import Measured, Prepared, Settings, Stage
from zenvllm.bench.results import Run
from zenvllm.bench.servers import say, servers_memory, wait_ready
from zenvllm.bench.workloads import FULL, QUICK, Workload
from zenvllm.core import gate
from zenvllm.core import quality as judging
from zenvllm.core.dtype import serving_dtype
from zenvllm.core.errors import UserError
from zenvllm.core.host import Host
from zenvllm.core.model import Model, read_model
from zenvllm.core.topology import read_host

DEFAULT_MAX_MODEL_LEN = 512
# The roofline's meta when the bandwidth is unknown: no roofline rows.
NO_BANDWIDTH = {"core_bandwidth_gbs": 0.0, "bandwidth_source": "unknown"}


def workload_from(quick: bool, overrides: Mapping[str, int]) -> Workload:
    """--quick's workload or the full one, with the workload flags given over it."""
    base = QUICK if quick else FULL
    fields: dict[str, Any] = dict(overrides)  # mypy checks ** against every field's type
    return replace(base, **fields)


SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
WEIGHTS_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def model_shape(model_dir: Path) -> dict[str, Any]:
    config = gate.read_json(model_dir / "config.json", gate.DOCUMENT, "fix the model's config")
    return {k: config.get(k) for k in SHAPE_KEYS}  # read_model checked it is an object


def weights_copies(specs: Sequence[str], model_dir: Path) -> tuple[layouts.Weights, ...]:
    """--weights NAME=DIR: other copies of --model's weights (same shape, same tokenizer),
    each measured as <layout>-NAME beside the planner's layouts on --model."""
    copies: list[layouts.Weights] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not WEIGHTS_NAME.fullmatch(name):
            raise UserError(
                f"--weights {spec}: give NAME=DIR, NAME in lowercase letters, digits and "
                "dashes (e.g. --weights int8=/models/m-w8a8)"
            )
        if name in {c.name for c in copies}:
            raise UserError(f"--weights {spec}: {name} is given twice; name each copy once")
        directory = gate.resolved(Path(path), f"--weights {spec}", "give a model's directory")
        if not directory.is_dir():
            raise UserError(f"--weights {spec}: {directory} is not a directory; give a model's")
        copy = read_model(directory)
        theirs, ours = model_shape(directory), model_shape(model_dir)
        if theirs != ours:
            differ = [f"{k} {theirs[k]} vs {ours[k]}" for k in SHAPE_KEYS if theirs[k] != ours[k]]
            raise UserError(
                f"--weights {spec}: not a copy of --model {model_dir.name} ({', '.join(differ)}); "
                "the comparison needs the same model in other weights"
            )
        copies.append(layouts.Weights(name, str(directory), copy))
    return tuple(copies)


def dtypes(stock: str, host: Host) -> tuple[str, str]:
    """(stock's dtype, the planner's) on this host: --stock-dtype plan gives stock the
    dtype the planner serves (core/dtype.py), so the two differ in their layout alone."""
    plan = serving_dtype(host).dtype
    return (plan if stock == "plan" else stock), plan


def peers_for(names: list[str], model: Model) -> tuple[list[str], list[str]]:
    """llama.cpp's configurations convert bf16 safetensors: a quantized --model has none."""
    if model.quantization is None:
        return names, []
    llamacpp = [n for n in names if catalogue.SPECS[n].kind == "llamacpp"]
    notes = [
        f"{n}: skipped: --model holds {model.quantization.label} weights; the llama.cpp "
        "peer converts bf16 weights to GGUF (bench the bf16 model with --weights NAME=DIR)"
        for n in llamacpp
    ]
    return [n for n in names if n not in llamacpp], notes


def prepare(request: flags.BenchRequest, model_dir: Path, model: Model) -> Prepared[Workload]:
    """The served length (--max-model-len, else DEFAULT_MAX_MODEL_LEN within the model's),
    the workload checked against it, and the configurations --configs and --weights name
    on this host, with the roofline's bandwidth (measured unless a dry run) and the
    notes on them."""
    max_len = request.max_model_len or min(DEFAULT_MAX_MODEL_LEN, model.max_model_len or 10**9)
    workload = workload_from(request.quick, request.workload_overrides())
    workload.check(max_len)
    names = layouts.parse_configs(request.configs, request.quick)
    copies = weights_copies(request.weights, model_dir)
    names, notes = peers_for(names, model)
    host = read_host()
    base, measured, calibrated = bandwidth.figures(host, model, measure=not request.dry_run)
    stock_dtype, plan_dtype = dtypes(request.stock_dtype, host)
    configs, resolved = layouts.resolve(
        names, host, model, request.base_port, max_len, base, copies, stock_dtype
    )
    configs, referred = (
        with_reference(configs, request.base_port, model)
        if request.quality
        else (configs, ["quality: not measured (--no-quality)"])
    )
    notes += [*calibrated, *resolved, *referred]
    return Prepared(
        host,
        max_len,
        workload,
        configs,
        notes,
        measured,
        dtypes=(stock_dtype, plan_dtype),
        formats=formats(configs, model, copies),
        performance=predicted.meta_of(host, model, [(c.path, c.model) for c in copies]),
    )


def with_reference(
    configs: list[Configuration], port: int, model: Model
) -> tuple[list[Configuration], list[str]]:
    """The quality reference first: stock vLLM in float32 on the same port (it runs
    alone, before stock), scored only; stock itself where it serves float32. A quantized
    --model has no float32 weights to refer to."""
    stock = next((c for c in configs if c.name == STOCK), None)
    if model.quantization is not None:
        return configs, [f"quality: not judged: --model holds {model.quantization.label} weights"]
    if stock and stock.servers and stock.servers[0].served_dtype == "float32":
        return configs, [f"quality: {STOCK} serves float32, one copy unsplit: the reference"]
    server = layouts.in_dtype(layouts.stock_server(port, "float32"), model)
    server = replace(server, name=f"zenvllm-bench-reference-{port}")
    summary = "stock vLLM in float32, one copy unsplit: the quality reference (scored only)"
    reference = Configuration(REFERENCE, REFERENCE_KIND, summary, "vllm-openai", (server,))
    return [reference, *configs], []


def formats(
    configs: list[Configuration], model: Model, copies: tuple[layouts.Weights, ...]
) -> dict[str, str]:
    """The quality format of each configuration whose weights are quantized (--model's
    or another copy's): its quantization's (core/quality.py)."""
    by_dir = {w.path: w.model for w in copies}
    out = {}
    for c in configs:
        if not c.servers or c.kind == "llamacpp":
            continue
        server = c.servers[0]
        q = (
            by_dir.get(server.model_dir, model).quantization
            if server.model_dir
            else model.quantization
        )
        if q is not None:
            out[c.name] = judging.format_of(q.method, q.label, server.served_dtype)
    return out


def measure(config: Configuration, stage: Stage[Workload]) -> Measured:
    """Warm a configuration up, run this visit's repeats and, at its last visit, batch 1
    (with the run's clients, vLLM's own `vllm bench serve`); read back what ran: its
    runs and batch-1 run, what ran and how it started, and the failures that leave its
    runs standing (batch 1's; an accelerator that did not run)."""
    if config.kind == REFERENCE_KIND:  # scored only
        facts = {"start": stage.started} if stage.started else {}
        return Measured({"quality_runs": [scored(config, stage)]}, facts)
    settings, w, tag = stage.settings, stage.settings.workload, stage.tag
    counted = config.kind == "llamacpp"
    shares = w.shares(len(stage.endpoints))
    if w.warmup_prompts:
        warm = [replace(s.repeat(0), num_prompts=max(1, s.warmup_prompts)) for s in shares]
        say(f"{tag}: warm-up, {w.warmup_prompts} prompts (not measured)")
        clients.run_clients(stage.pool, stage.endpoints, warm, f"{config.name}-warmup", counted)
    runs = []
    for repeat in stage.visit.repeats:
        load = os.getloadavg()[0]
        stem = f"{config.name}-r{repeat}"
        mine = [s.repeat(repeat) for s in shares]
        done = clients.run_clients(stage.pool, stage.endpoints, mine, stem, counted)
        used = servers_memory(config.servers)
        run = results.combine(config.name, repeat, done, load, used, w.concurrency)
        runs.append(run)
        say(
            f"{tag}: repeat {repeat}/{w.repeats}: {run.output_tok_s:.1f} output tok/s, "
            f"TTFT {run.median_ttft_ms:.0f} ms, TPOT {run.median_tpot_ms:.1f} ms "
            f"(load {load:.2f})"
        )
    if not stage.visit.last:  # batch 1, quality and how it ran: at its last visit
        return Measured({"runs": [asdict(r) for r in runs]}, {})
    failures: list[str] = []
    one: Run | None = None
    try:
        one = batch1(config, stage) if w.batch1_prompts else None
    except (RuntimeError, ValueError) as err:
        say(f"{tag}: batch 1 FAILED: {err}")
        failures.append(f"{config.name} batch 1: {err}")
    rated = rate(config, stage, failures) if settings.quality else []
    wait = partial(wait_ready, timeout_s=settings.start_timeout_s)
    facts = backend.facts(config, stage.raw, stage.started, settings.restart, wait, say)
    ran = facts.get("backend", {})
    if ran.get("active") is False:  # never presented as what it is not
        failures.append(backend.describe(config.name, config.target, ran))
    rows = {"runs": [asdict(r) for r in runs], "batch1": [asdict(one)] if one else []}
    return Measured({**rows, "quality_runs": rated}, facts, failures)


# What a server's API cannot be asked, by its kind: recorded as not measured, never passed.
UNSCORED = {
    "llamacpp": "not measured: llama.cpp's server echoes no prompt logprobs (vLLM's "
    "completions API with echo), so its perplexity cannot be read the same way",
}


def quality_row(config: Configuration, stage: Stage[Workload], **figures: Any) -> dict[str, Any]:
    """A raw quality row: the configuration, its format (its quantization's, else its
    first server's dtype), what its server scored (or a note why not)."""
    server = config.servers[0]
    gguf = f"gguf {server.gguf}" if server.gguf else ""
    fmt = stage.settings.formats.get(config.name) or gguf or server.served_dtype
    empty: dict[str, Any] = {
        "perplexity": None,
        "scored_tokens": 0,
        "text": "",
        "greedy": [],
        "note": "",
    }
    return {"config": config.name, "format": fmt, **empty, **figures}


def rate(
    config: Configuration, stage: Stage[Workload], failures: list[str]
) -> list[dict[str, Any]]:
    """Its quality row (none for the gateway: its servers are the planner's); a
    measurement that fails is a failure of the run and a row that says so."""
    if not config.servers:
        return []
    try:
        return [scored(config, stage)]
    except (RuntimeError, ValueError, OSError, UserError) as err:
        say(f"{stage.tag}: quality FAILED: {err}")
        failures.append(f"{config.name} quality: {err}")
        return [quality_row(config, stage, note=f"not measured: {err}")]


def scored(config: Configuration, stage: Stage[Workload]) -> dict[str, Any]:
    """A configuration's quality through its first server (bench/quality.py)."""
    if config.kind in UNSCORED:
        return quality_row(config, stage, note=UNSCORED[config.kind])
    url, model = stage.endpoints[0]
    settings = stage.settings
    figures = quality.scored(url, model, settings.model_dir, settings.max_model_len)
    say(
        f"{stage.tag}: quality: perplexity {figures['perplexity']:.4f} over "
        f"{figures['scored_tokens']} tokens of {figures['text']}"
    )
    return quality_row(config, stage, **figures)


def batch1(config: Configuration, stage: Stage[Workload]) -> Run | None:
    """Batch 1: one request at a time to the first instance, the latency an interactive
    user gets (the gateway has no instance of its own: through nginx it would measure
    nginx too)."""
    if not config.servers:
        return None
    w = stage.settings.workload
    load = os.getloadavg()[0]
    stem = f"{config.name}-batch1"
    counted = config.kind == "llamacpp"
    done = clients.run_clients(stage.pool, stage.endpoints[:1], [w.batch1()], stem, counted)
    run = results.combine(config.name, 1, done, load, concurrency=1)
    say(
        f"{stage.tag}: batch 1, {w.batch1_prompts} prompts one at a time: "
        f"{run.output_tok_s:.1f} output tok/s, TTFT {run.median_ttft_ms:.0f} ms, "
        f"TPOT {run.median_tpot_ms:.1f} ms (load {load:.2f})"
    )
    return run


def meta(settings: Settings[Workload]) -> dict[str, Any]:
    """What a generating model's results say of their run beyond every run's: the dtypes
    (the speed guard compares runs where they match), --serve-env, the roofline's, the
    performance model's inputs (bench/predicted.py)."""
    return {
        "stock_dtype": settings.stock_dtype,
        "plan_dtype": settings.plan_dtype,
        "serve_env": settings.serve_env,  # --serve-env: over the plan's env
        "weight_bytes": settings.weight_bytes,
        **(settings.bandwidth.meta() if settings.bandwidth else NO_BANDWIDTH),
        "host_cores": settings.host_cores,
        **settings.performance,
    }
