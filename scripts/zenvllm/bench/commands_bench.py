"""`zenvllm bench`: stock vLLM against the planner's layouts, measured by `vllm bench serve`."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from zenvllm.bench import (
    bandwidth,
    catalogue,
    commands_embed,
    flags,
    gateway,
    layouts,
    metrics,
    report,
    runner,
    workloads,
)
from zenvllm.bench.gateway import Deployment
from zenvllm.bench.preflight import (
    checked_paths,
    default_image,
    describe_host,
    has_compiler,
    image_present,
    print_plan,
)
from zenvllm.bench.roofline import Bandwidth
from zenvllm.core import gate
from zenvllm.core.container import EAGER_PIPELINE
from zenvllm.core.cores import usable_cores
from zenvllm.core.dtype import serving_dtype
from zenvllm.core.errors import UserError
from zenvllm.core.host import Host
from zenvllm.core.model import Model, read_model
from zenvllm.core.topology import read_host
from zenvllm.deploy.playbooks import BENCH_EXTRA
from zenvllm.image import baseimage, peers, render

DEFAULT_MAX_MODEL_LEN = 512


def workload_from(quick: bool, overrides: Mapping[str, int]) -> workloads.Workload:
    """--quick's workload or the full one, with the workload flags given over it."""
    base = workloads.QUICK if quick else workloads.FULL
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


def run(args: argparse.Namespace) -> int:
    """The command's entry point: its flags, read once into a request, then the bench:
    the embedding bench with --embed (bench/commands_embed.py), else this one."""
    request = flags.request_of(vars(args))
    if request.embed:
        return commands_embed.run(request)
    model_dir, out_dir, compile_cache = checked_paths(request)
    model = read_model(model_dir)
    max_len = request.max_model_len or min(DEFAULT_MAX_MODEL_LEN, model.max_model_len or 10**9)
    workload = workload_from(request.quick, request.workload_overrides())
    workload.check(max_len)
    host, measured, configs, notes = configurations(request, model_dir, model, max_len)
    images, configs = choose_images(request.images, request.dry_run, configs, notes, host)
    stock = images["vllm-openai"]  # probed for a compiler, served by the gateway's deployment
    workload = eager_if_needed(request.dry_run, request.compile, workload, stock, notes)
    configs = without_eager_pipelines(configs, workload, notes)
    gateway_url, deployment, configs = choose_gateway(
        request.gateway_flag,
        request.out,
        request.base_port,
        configs,
        notes,
        model_dir,
        stock,
        workload,
        max_len,
    )
    if request.dry_run:  # its JSON carries the notes
        return print_plan(configs, images, workload, notes)
    for note in notes:
        runner.say(f"note: {note}")
    stock_dtype, plan_dtype = dtypes(request.stock_dtype, host)
    settings = runner.Settings(
        model_dir=model_dir,
        model_name=model.name,
        images=images,
        workload=workload,
        max_model_len=max_len,
        out_dir=out_dir,  # docker -v needs an absolute path
        gateway_url=gateway_url,
        gateway_deploy=deployment,
        start_timeout_s=request.start_timeout,
        plots=request.plots,
        host_label=describe_host(host),
        notes=notes,
        weight_bytes=model.weight_bytes,
        bandwidth=measured,
        host_cores=sum(len(c) for c in usable_cores(host).values()),
        gguf=convert_for_peers(configs, model_dir),
        compile_cache_dir=compile_cache,
        serve_env=dict(request.serve_env),
        restart=request.restart,
        stock_dtype=stock_dtype,
        plan_dtype=plan_dtype,
    )
    return measure_and_report(configs, settings, request.out, request.metrics_file)


def configurations(
    request: flags.BenchRequest, model_dir: Path, model: Model, max_len: int
) -> tuple[Host, Bandwidth | None, list[layouts.Configuration], list[str]]:
    """(this host, its bandwidth, the configurations --configs and --weights name on it,
    the notes on them)."""
    names = layouts.parse_configs(request.configs, request.quick)
    copies = weights_copies(request.weights, model_dir)
    names, notes = peers_for(names, model)
    host = read_host()
    base, measured, calibrated = bandwidth.figures(host, model, measure=not request.dry_run)
    stock_dtype = dtypes(request.stock_dtype, host)[0]
    configs, resolved = layouts.resolve(
        names, host, model, request.base_port, max_len, base, copies, stock_dtype
    )
    notes += [*calibrated, *resolved]
    return host, measured, configs, notes


def measure_and_report(
    configs: list[layouts.Configuration],
    settings: runner.Settings,
    out: Path,
    metrics_file: Path | None,
) -> int:
    """Run the bench, print its table, write --metrics-file: the exit status."""
    result, status = runner.run_bench(configs, settings)
    print_summary(result, out)
    if metrics_file:
        metrics.write_metrics_file(metrics_file, result)
        runner.say(f"metrics: {metrics_file}")
    return status


def choose_images(
    tags: flags.ImageTags,
    dry_run: bool,
    configs: list[layouts.Configuration],
    notes: list[str],
    host: Host,
) -> tuple[dict[str, str], list[layouts.Configuration]]:
    """Stock is the baseline, so its image must exist; without the zen or pace image or
    the llama.cpp peer's (built for this CPU) their configurations are skipped with a note
    rather than failing the run."""
    images = {"vllm-openai": tags.vllm_openai or default_image("vllm-openai")}
    if any(c.target == "zen" for c in configs):
        images["zen"] = tags.zen or default_image("zen")
    if any(c.target == "pace" for c in configs):
        images["pace"] = tags.pace or default_image("pace")
    if any(c.target == "llamacpp" for c in configs):
        config = render.load_config()
        images["llamacpp"] = tags.llamacpp or peers.default_tag(
            config, "llamacpp", peers.cpu_key(host.flags)
        )
    if dry_run:  # no engine call: say what was not checked
        notes.append(f"--dry-run: images not checked ({', '.join(sorted(images.values()))})")
        return images, configs
    for target, tag in images.items():
        if not image_present(tag):
            if target == "vllm-openai":
                raise UserError(
                    f"image {tag} not found; build it with `make image` (or pass --image TAG)"
                )
            notes.append(
                f"{target} configurations skipped: image {tag} not built "
                f"(make {'peer-image' if target == 'llamacpp' else f'image TARGET={target}'})"
            )
            configs = [c for c in configs if c.target != target]
    return images, configs


def convert_for_peers(configs: list[layouts.Configuration], model_dir: Path) -> dict[str, Path]:
    """The GGUF files the llama.cpp configurations serve, converted once and cached."""
    kinds = sorted({s.gguf for c in configs if c.kind == "llamacpp" for s in c.servers})
    if not kinds:
        return {}
    try:  # the bench extra's packages: every other verb runs without them
        from zenvllm.bench import to_gguf
    except ImportError as err:
        raise UserError(
            f"the llama.cpp configurations need {err.name} to write GGUF: "
            f"install the bench extra ({BENCH_EXTRA}), or leave llamacpp out of --configs"
        ) from None
    files = {}
    for kind in kinds:
        runner.say(f"GGUF {kind}: converting {model_dir.name} (cached after the first run)")
        files[kind] = to_gguf.cached_gguf(model_dir, kind, baseimage.cache_dir())
    return files


def eager_if_needed(
    dry_run: bool,
    keep_compiled: bool,
    workload: workloads.Workload,
    image: str,
    notes: list[str],
) -> workloads.Workload:
    """Without a C++ compiler torch.compile fails, so every configuration (stock too, to
    keep the comparison fair) runs eager; --compile keeps compiled mode regardless."""
    if dry_run and not (workload.enforce_eager or keep_compiled):
        notes.append(
            f"--dry-run: compiled or eager mode unknown (the run looks for a C++ compiler "
            f"in {image}; --compile keeps compiled mode)"
        )
        return workload
    eager = not (workload.enforce_eager or keep_compiled or has_compiler(image))
    if eager:
        workload = replace(workload, enforce_eager=True)
        notes.append(
            f"{image} has no C++ compiler, which torch.compile needs on the "
            "CPU: every configuration (stock included) runs with --enforce-eager"
        )
    return workload


def without_eager_pipelines(
    configs: list[layouts.Configuration], workload: workloads.Workload, notes: list[str]
) -> list[layouts.Configuration]:
    """A pipeline runs compiled or not at all (core.container.EAGER_PIPELINE)."""
    if not workload.enforce_eager:
        return configs
    notes += [f"{c.name}: skipped: {EAGER_PIPELINE}" for c in configs if c.kind == "pp"]
    return [c for c in configs if c.kind != "pp"]


def choose_gateway(
    gateway_flag: str | None,
    out: Path,
    base_port: int,
    configs: list[layouts.Configuration],
    notes: list[str],
    model_dir: Path,
    image: str,
    workload: workloads.Workload,
    max_len: int,
) -> tuple[str | None, Deployment | None, list[layouts.Configuration]]:
    """(gateway URL, deployment, configurations): --gateway (`gateway_flag`) picks deploy.yml's
    own deployment or a running one; without it the gateway configurations are dropped."""
    gateway_url, deployment = None, None
    if any(c.kind == "gateway" for c in configs):
        if gateway_flag == "deploy":
            deployment = gateway.deployment_for(
                out, base_port, model_dir, image, workload.enforce_eager, max_len
            )
            notes.append(
                f"gateway: deploy.yml's own deployment (planner auto, nginx on :{deployment.port})"
            )
        elif gateway_flag:
            gateway_url = gateway_flag
            notes.append(f"gateway: the running deployment at {gateway_url}")
        else:
            notes.append("gateway: skipped; pass --gateway deploy or --gateway URL")
            configs = [c for c in configs if c.kind != "gateway"]
    return gateway_url, deployment, configs


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark stock vLLM against the planner's layouts (vllm bench serve)",
        description="Run `vllm bench serve` (from the image) against stock vLLM, the "
        "planner's layouts and a deploy.yml gateway; write JSON, CSV, a Markdown table "
        "and PNG plots.",
    )
    flags.add_target_flags(parser)
    flags.add_workload_flags(parser)
    flags.add_server_flags(parser)
    flags.add_image_flags(parser)
    flags.add_output_flags(parser)
    parser.set_defaults(func=run)


def print_summary(result: dict[str, Any], out_dir: Path) -> None:
    """The table of a finished run, and where its files are."""
    print()
    print(report.markdown(result), end="")
    print(f"\noutputs in {out_dir}: results.json runs.csv summary.csv table.md *.png", flush=True)
