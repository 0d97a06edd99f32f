"""`zenvllm bench`: stock vLLM against the planner's layouts and the peers, measured by
`vllm bench serve`, for a model of either kind (bench/kinds.py): the command's one entry
point; its flags are bench/flags.py's. What every kind shares before the runner does:
the images, compiled or eager, the gateway, the peers' files (GGUF, ONNX), the
settings."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from zenvllm.bench import flags, gateway, kinds, layouts, metrics, report, runner, to_onnx
from zenvllm.bench.catalogue import INFINITY
from zenvllm.bench.gateway import Deployment
from zenvllm.bench.kinds import Kind
from zenvllm.bench.measuring import Settings
from zenvllm.bench.preflight import (
    checked_paths,
    default_image,
    describe_host,
    has_compiler,
    image_present,
    print_plan,
)
from zenvllm.bench.servers import CONTAINER_USER, say
from zenvllm.bench.workloads import AnyWorkload
from zenvllm.core.container import EAGER_PIPELINE
from zenvllm.core.cores import usable_cores
from zenvllm.core.errors import UserError
from zenvllm.core.host import Host
from zenvllm.core.model import read_model
from zenvllm.deploy.playbooks import BENCH_EXTRA
from zenvllm.image import baseimage, peers, render


def run(args: argparse.Namespace) -> int:
    """The command's entry point: its flags, read once into a request, then the bench of
    the model's kind (bench/kinds.py: a pooling model's, or --embed's; else a generating
    model's): its configurations and workload, the images, then the one runner."""
    request = flags.request_of(vars(args))
    model_dir, out_dir, compile_cache = checked_paths(request)
    model = read_model(model_dir)
    kind = kinds.of_model(model, request.embed, model_dir)
    ready = kind.prepare(request, model_dir, model)
    host, notes = ready.host, ready.notes
    images, configs = choose_images(request.images, request.dry_run, ready.configs, notes, host)
    stock = images["vllm-openai"]  # probed for a compiler, served by the gateway's deployment
    workload = eager_if_needed(request.dry_run, request.compile, ready.workload, stock, notes)
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
        ready.max_model_len,
    )
    if request.dry_run:  # its JSON carries the notes
        return print_plan(configs, images, workload, notes)
    for note in notes:
        say(f"note: {note}")
    settings = Settings(
        model_dir=model_dir,
        model_name=model.name,
        images=images,
        workload=workload,
        max_model_len=ready.max_model_len,
        out_dir=out_dir,  # docker -v needs an absolute path
        gateway_url=gateway_url,
        gateway_deploy=deployment,
        start_timeout_s=request.start_timeout,
        plots=request.plots,
        host_label=describe_host(host),
        cpu=cpu_of(host),
        notes=notes,
        weight_bytes=model.weight_bytes,
        bandwidth=ready.bandwidth,
        host_cores=sum(len(c) for c in usable_cores(host).values()),
        gguf=convert_for_peers(configs, model_dir),
        onnx_dir=onnx_for(configs, model_dir, images, ready.pooling),
        infinity_version=peer_version(configs, INFINITY),
        compile_cache_dir=compile_cache,
        serve_env=dict(request.serve_env),
        restart=request.restart,
        ordering=request.ordering,
        quality=request.quality,
        stock_dtype=ready.dtypes[0],
        plan_dtype=ready.dtypes[1],
        formats=ready.formats,
        performance=ready.performance,
    )
    return measure_and_report(kind, configs, settings, request.out, request.metrics_file)


def measure_and_report(
    kind: Kind[AnyWorkload],
    configs: list[layouts.Configuration],
    settings: Settings[AnyWorkload],
    out: Path,
    metrics_file: Path | None,
) -> int:
    """Run the bench, print its table, write --metrics-file: the exit status."""
    result, status = runner.run_bench(kind, configs, settings)
    print_summary(result, out, kind.plot_files)
    if metrics_file:
        metrics.write_metrics_file(metrics_file, result)
        say(f"metrics: {metrics_file}")
    return status


def cpu_of(host: Host) -> str:
    """The CPU's name, generation, family and model, for the results."""
    return f"{host.cpu_name} (cpu family {host.family}, model {host.cpu_model})"


def choose_images(
    tags: flags.ImageTags,
    dry_run: bool,
    configs: list[layouts.Configuration],
    notes: list[str],
    host: Host,
) -> tuple[dict[str, str], list[layouts.Configuration]]:
    """Stock is the baseline, so its image (vLLM's, which every client runs too) must
    exist; without the zen or pace image or a peer's (llama.cpp's, built for this CPU;
    infinity's) their configurations are skipped with a note rather than failing the run."""
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
    if any(c.target == INFINITY for c in configs):
        config = render.load_config()
        images[INFINITY] = tags.infinity or peers.default_tag(config, INFINITY, "")
    if dry_run:  # no engine call: say what was not checked
        notes.append(f"--dry-run: images not checked ({', '.join(sorted(images.values()))})")
        return images, configs
    for target, tag in images.items():
        if not image_present(tag):
            if target == "vllm-openai":
                raise UserError(
                    f"image {tag} not found; build it with `make image` (or pass --image TAG)"
                )
            notes.append(f"{target} configurations skipped: image {tag} not built ({MAKE[target]})")
            configs = [c for c in configs if c.target != target]
    return images, configs


# How each image that may be missing is built.
MAKE = {
    "zen": "make image TARGET=zen",
    "pace": "make image TARGET=pace",
    "llamacpp": "make peer-image",
    INFINITY: f"make peer-image PEER={INFINITY}",
}


def convert_for_peers(configs: list[layouts.Configuration], model_dir: Path) -> dict[str, Path]:
    """The GGUF files the llama.cpp configurations serve, converted once and cached."""
    types = sorted({s.gguf for c in configs if c.kind == "llamacpp" for s in c.servers})
    if not types:
        return {}
    try:  # the bench extra's packages: every other verb runs without them
        from zenvllm.bench import to_gguf
    except ImportError as err:
        raise UserError(
            f"the llama.cpp configurations need {err.name} to write GGUF: "
            f"install the bench extra ({BENCH_EXTRA}), or leave llamacpp out of --configs"
        ) from None
    files = {}
    for gguf in types:
        say(f"GGUF {gguf}: converting {model_dir.name} (cached after the first run)")
        files[gguf] = to_gguf.cached_gguf(model_dir, gguf, baseimage.cache_dir())
    return files


def onnx_for(
    configs: list[layouts.Configuration], model_dir: Path, images: dict[str, str], pooling: str
) -> Path | None:
    """The infinity peer's ONNX directory, exported once per model by the peer's own image."""
    if not any(c.target == INFINITY for c in configs):
        return None
    say(f"ONNX: exporting {model_dir.name} for infinity (cached after the first run)")
    uid = CONTAINER_USER[0]
    return to_onnx.cached_onnx(model_dir, images[INFINITY], pooling, baseimage.cache_dir(), uid)


def peer_version(configs: list[layouts.Configuration], target: str) -> str:
    """The pinned version of a peer that runs (build.yaml's peers), for what it serves."""
    if not any(c.target == target for c in configs):
        return ""
    return str(render.load_config()["peers"][target]["version"])


def eager_if_needed(
    dry_run: bool,
    keep_compiled: bool,
    workload: AnyWorkload,
    image: str,
    notes: list[str],
) -> AnyWorkload:
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
    configs: list[layouts.Configuration], workload: AnyWorkload, notes: list[str]
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
    workload: AnyWorkload,
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
        "planner's layouts, the peers and a deploy.yml gateway; a generating model in "
        "output tokens/s, a pooling (embedding) model in inputs/s per batch size; write "
        "JSON, CSV, a Markdown table and PNG plots.",
    )
    flags.add_target_flags(parser)
    flags.add_workload_flags(parser)
    flags.add_server_flags(parser)
    flags.add_image_flags(parser)
    flags.add_output_flags(parser)
    parser.set_defaults(func=run)


def print_summary(result: dict[str, Any], out_dir: Path, plot_files: Sequence[str]) -> None:
    """The table of a finished run, and where its files are."""
    print()
    print(report.markdown(result), end="")
    files = " ".join(("results.json", "runs.csv", "summary.csv", "table.md", *plot_files))
    print(f"\noutputs in {out_dir}: {files}", flush=True)
