"""`zenvllm bench --embed`: embedding throughput of stock vLLM, the planner's layout
and infinity-emb on one embedding model, measured by vLLM's own `vllm bench serve`.

The verb is `zenvllm bench` (bench/commands_bench.py registers its flags and sends
`--embed` here, with the request it read). This module reads what the embedding bench
needs of the request, decides
the configurations (bench/embed_configs.py) and the workload
(bench/embed_workload.py), exports the peer's ONNX file once (bench/to_onnx.py)
and hands them to bench/embed_runner.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from zenvllm.bench import (
    bandwidth,
    embed_configs,
    embed_report,
    embed_runner,
    flags,
    preflight,
    runner,
    to_onnx,
)
from zenvllm.bench.embed_workload import EmbedWorkload, parse_batch_sizes
from zenvllm.bench.layouts import Configuration
from zenvllm.core.errors import UserError
from zenvllm.core.host import Host
from zenvllm.core.model import POOLING, Model, read_model
from zenvllm.core.topology import read_host
from zenvllm.image import baseimage, peers, render

QUICK = EmbedWorkload(
    input_len=32, batch_sizes=(1, 8), inputs=32, concurrency=2, repeats=1, warmup_inputs=8
)


def workload_of(request: flags.BenchRequest) -> EmbedWorkload:
    """The default (or --quick) workload with the flags given over it: --num-prompts
    counts inputs, --warmup-prompts warm-up inputs."""
    base = QUICK if request.quick else EmbedWorkload()
    given = {
        "input_len": request.input_len,
        "inputs": request.num_prompts,
        "concurrency": request.concurrency,
        "repeats": request.repeats,
        "warmup_inputs": request.warmup_prompts,
    }
    chosen: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    w = replace(base, **chosen)
    return (
        replace(w, batch_sizes=parse_batch_sizes(request.batch_sizes)) if request.batch_sizes else w
    )


def refuse_generation_flags(request: flags.BenchRequest) -> None:
    """Flags of the generation bench that mean nothing for embeddings."""
    given = [
        name
        for name, value in (
            ("--output-len", request.output_len),
            ("--batch1-prompts", request.batch1_prompts),
            ("--weights", request.weights),
            ("--gateway", request.gateway_flag),
            ("--serve-env", request.serve_env),
            ("--metrics-file", request.metrics_file),
        )
        if value
    ]
    if given:
        raise UserError(f"{given[0]} is not an option of the embedding bench (--embed)")


def max_len_of(request: flags.BenchRequest, model: Model, longest: int | None) -> int:
    """The served length: --max-model-len, else the sentence-transformers model's own
    longest input (vLLM refuses more for such a model), else the config's."""
    return request.max_model_len or longest or model.max_model_len or 512


def images_of(
    request: flags.BenchRequest, configs: list[Configuration], notes: list[str]
) -> tuple[dict[str, str], list[Configuration]]:
    """vLLM's image (servers and every client) must exist; without the peer's image the
    peer is skipped with a note."""
    images = {"vllm-openai": request.images.vllm_openai or preflight.default_image("vllm-openai")}
    if any(c.target == embed_configs.PEER for c in configs):
        config = render.load_config()
        tag = request.images.infinity or peers.default_tag(config, embed_configs.PEER, "")
        images[embed_configs.PEER] = tag
        if not request.dry_run and not preflight.image_present(tag):
            notes.append(f"infinity skipped: image {tag} not built (make peer-image PEER=infinity)")
            configs = [c for c in configs if c.target != embed_configs.PEER]
    if not request.dry_run and not preflight.image_present(images["vllm-openai"]):
        raise UserError(f"image {images['vllm-openai']} not found; build it with `make image`")
    return images, configs


def eager_if_needed(
    request: flags.BenchRequest, w: EmbedWorkload, image: str, notes: list[str]
) -> EmbedWorkload:
    """As the generation bench: without a C++ compiler every server runs eager."""
    if request.dry_run or w.enforce_eager or request.compile:
        return w
    if preflight.has_compiler(image):
        return w
    notes.append(f"{image} has no C++ compiler: every vLLM server runs with --enforce-eager")
    return replace(w, enforce_eager=True)


def cpu_of(host: Host) -> str:
    return f"{host.cpu_name} (cpu family {host.family}, model {host.cpu_model})"


def run(request: flags.BenchRequest) -> int:
    """The embedding bench, from the bench's request: its exit status."""
    refuse_generation_flags(request)
    model_dir, out_dir, compile_cache = preflight.checked_paths(request)
    model = read_model(model_dir)
    if model.runner != POOLING:
        raise UserError(f"--embed: {model_dir.name} is not an embedding model ({model.runner_why})")
    pooling, longest = to_onnx.sentence_transformers(model_dir)
    max_len = max_len_of(request, model, longest)
    workload = workload_of(request)
    workload.check(max_len)
    host = read_host()
    base, _, notes = bandwidth.figures(host, model, measure=False)
    names = embed_configs.parse_configs(request.configs)
    configs, resolved = embed_configs.resolve(
        names, host, model, request.base_port, max_len, pooling, base
    )
    notes = [n for n in notes if "roofline" not in n] + resolved
    images, configs = images_of(request, configs, notes)
    workload = eager_if_needed(request, workload, images["vllm-openai"], notes)
    if request.dry_run:
        return preflight.print_plan(configs, images, workload, notes)
    settings = embed_runner.Settings(
        model_dir=model_dir,
        model_name=model.name,
        images=images,
        workload=workload,
        max_model_len=max_len,
        out_dir=out_dir,
        onnx_dir=onnx_for(configs, model_dir, images, pooling),
        infinity_version=str(render.load_config()["peers"][embed_configs.PEER]["version"]),
        start_timeout_s=request.start_timeout,
        plots=request.plots,
        host_label=preflight.describe_host(host),
        cpu=cpu_of(host),
        notes=notes,
        compile_cache_dir=compile_cache,
    )
    for note in notes:
        runner.say(f"note: {note}")
    result, status = embed_runner.run_embed(configs, settings)
    print(embed_report.markdown(result), end="")
    print(f"outputs in {request.out}: results.json runs.csv summary.csv table.md", flush=True)
    return status


def onnx_for(
    configs: list[Configuration], model_dir: Path, images: dict[str, str], pooling: str
) -> Path | None:
    """The peer's ONNX directory, exported once per model by the peer's own image."""
    if not any(c.target == embed_configs.PEER for c in configs):
        return None
    runner.say(f"ONNX: exporting {model_dir.name} for infinity (cached after the first run)")
    uid = runner.CONTAINER_USER[0]
    image = images[embed_configs.PEER]
    return to_onnx.cached_onnx(model_dir, image, pooling, baseimage.cache_dir(), uid)
