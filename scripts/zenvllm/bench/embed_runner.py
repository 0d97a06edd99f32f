"""The embedding bench's side-effect edge: each configuration's servers up, its
clients (`vllm bench serve` with an embedding backend, from vLLM's image) at every
batch size, one vector read back, the servers removed; the files written.

Reuses the generation bench's edge (bench/runner.py): the same labels, /health
waits, logs and clean-up, the same staged output directory.
"""

from __future__ import annotations

import math
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from zenvllm.bench import (
    clients,
    embed_configs,
    embed_report,
    http_client,
    launch,
    leftovers,
    runner,
)
from zenvllm.bench.catalogue import STOCK
from zenvllm.bench.embed_results import EmbedClient, EmbedRun, combine, parse_result
from zenvllm.bench.embed_workload import BACKENDS, EmbedWorkload, Share, client_args, shares
from zenvllm.bench.layouts import MODEL_MOUNT, Configuration, Server
from zenvllm.bench.meta import run_meta
from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.deploy import outputs
from zenvllm.runtime.engine import DOCKER

# One sentence every configuration embeds after its runs: the same model gives one vector.
PROBE = "The quick brown fox jumps over the lazy dog."


@dataclass(frozen=True)
class Settings:
    model_dir: Path
    model_name: str
    images: dict[str, str]  # target -> tag: vllm-openai (servers and clients), infinity
    workload: EmbedWorkload
    max_model_len: int
    out_dir: Path
    onnx_dir: Path | None  # the peer's ONNX directory (None: no peer)
    infinity_version: str = ""
    start_timeout_s: float = 900.0
    client_timeout_s: float = 1800.0
    plots: bool = True
    host_label: str = ""
    cpu: str = ""  # the CPU's name, generation, family and model
    notes: list[str] = field(default_factory=list)
    compile_cache_dir: str = ""


def launch_of(
    server: Server, config: Configuration, settings: Settings, raw: Path, run_id: str
) -> launch.Launch:
    """How one server starts: infinity's command, vLLM's guide's (stock) or the
    deployment's container (the planner's), with a compile cache of the run's own."""
    if config.kind == embed_configs.PEER:
        assert settings.onnx_dir is not None
        image = settings.images[config.target]
        return launch.infinity_launch(server, image, settings.onnx_dir, run_id)
    container = launch.container_settings(
        settings.images[config.target],
        settings.model_dir,
        settings.max_model_len,
        settings.workload.enforce_eager,
        raw,
        compile_cache_dir=settings.compile_cache_dir
        or (str(raw / runner.RUN_CACHE) if server.instance else ""),
        target=config.target,
    )
    return launch.server_launch(server, container, run_id)


def start(
    config: Configuration, settings: Settings, raw: Path, run_id: str, tag: str
) -> dict[str, Any]:
    """Every port checked free first, then the servers started and waited for."""
    for s in config.servers:
        if runner.port_in_use(s.port):
            raise UserError(
                f"port {s.port} is already in use; stop what listens or pass --base-port"
            )
    runner.say(f"{tag}: starting {config.shape} ({settings.images[config.target]})")
    specs = [launch_of(s, config, settings, raw, run_id) for s in config.servers]
    for spec in specs:
        for path, text in spec.files.items():
            Path(path).write_text(text)
        for path in spec.dirs:
            Path(path).mkdir(parents=True, exist_ok=True)
            os.chown(path, *runner.CONTAINER_USER)
    for spec in specs:
        DOCKER.run(*spec.argv, check=True)
    took = runner.wait_ready([(s.name, s.port) for s in config.servers], settings.start_timeout_s)
    runner.say(f"{tag}: ready in {took:.0f} s")
    return {"ready_s": round(took, 1)}


def run_clients(
    settings: Settings,
    raw: Path,
    run_id: str,
    kind: str,
    urls: list[str],
    mine: list[Share],
    stem: str,
) -> list[EmbedClient]:
    """One client per endpoint, all at once, from vLLM's image; their files parsed."""
    procs = []
    for i, (url, share) in enumerate(zip(urls, mine, strict=True)):
        name = f"{stem}-client{i}.json"
        args = client_args(url, kind, share, "/results", name)
        argv = launch.client_command(
            f"zenvllm-bench-client-{run_id}-{stem}-{i}",
            settings.images["vllm-openai"],
            settings.model_dir,
            raw,
            run_id,
            args,
        )
        log = (raw / f"{stem}-client{i}.log").open("w")
        procs.append((DOCKER.stream(*argv, out=log), name, share))
    files = clients.finished([(p, n) for p, n, _ in procs], raw, settings.client_timeout_s)
    found = []
    for (path, data), (_, _, share) in zip(files, procs, strict=True):
        found.append(parse_result(data, str(path), path.stat().st_mtime, share.requests))
    return found


def measure_batches(
    config: Configuration, settings: Settings, raw: Path, run_id: str, tag: str
) -> list[EmbedRun]:
    """At each batch size: a warm-up, then the repeats, each with its own inputs."""
    w = settings.workload
    kind = embed_configs.client_kind(config)
    urls = [f"http://127.0.0.1:{s.port}" for s in config.servers]
    runs = []
    for batch in w.batch_sizes:
        if w.warmup_requests(batch):
            warm = shares(w.repeat(0), batch, len(urls), w.warmup_requests(batch))
            run_clients(settings, raw, run_id, kind, urls, warm, f"{config.name}-b{batch}-warmup")
        for repeat in range(1, w.repeats + 1):
            load = os.getloadavg()[0]
            mine = shares(w.repeat(repeat), batch, len(urls))
            stem = f"{config.name}-b{batch}-r{repeat}"
            found = run_clients(settings, raw, run_id, kind, urls, mine, stem)
            run = combine(config.name, batch, repeat, found, load, w.concurrency)
            runs.append(run)
            runner.say(
                f"{tag}: batch {batch} repeat {repeat}/{w.repeats}: {run.inputs_s:g} inputs/s, "
                f"{run.tokens_s:g} tokens/s, p50 {run.p50_ms:g} ms, p99 {run.p99_ms:g} ms "
                f"(load {load:.2f})"
            )
    return runs


def vector(config: Configuration) -> list[float]:
    """The first server's vector for PROBE, through the endpoint the clients use."""
    _, endpoint = BACKENDS[embed_configs.client_kind(config)]
    url = f"http://127.0.0.1:{config.servers[0].port}{endpoint}"
    body = {"model": MODEL_MOUNT, "input": [PROBE]}
    try:
        reply = gate.parse_json(http_client.post(url, body, 120).decode(), url, "")
        return [float(x) for x in reply["data"][0]["embedding"]]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise RuntimeError(f"{url}: no vector for one sentence ({err})") from None


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def measure(
    index: int, total: int, config: Configuration, settings: Settings, raw: Path, run_id: str
) -> tuple[list[EmbedRun], dict[str, Any], list[float]]:
    """One configuration: started, measured, its vector read, removed."""
    tag = f"[{index}/{total}] {config.name}"
    try:
        ready = start(config, settings, raw, run_id, tag)
        runs = measure_batches(config, settings, raw, run_id, tag)
        probe = vector(config)
        serves = embed_configs.serves(config, settings.infinity_version)
        return runs, {"start": ready, "serves": serves}, probe
    finally:
        runner.stop(config.name, config.servers, raw)


def measure_all(
    configs: list[Configuration], settings: Settings, raw: Path, run_id: str
) -> tuple[list[EmbedRun], dict[str, dict[str, Any]], list[str]]:
    """Every configuration in turn; one that fails is a failure, the others still run."""
    runs: list[EmbedRun] = []
    facts: dict[str, dict[str, Any]] = {}
    vectors: dict[str, list[float]] = {}
    failures: list[str] = []
    for index, config in enumerate(configs, 1):
        try:
            mine, facts[config.name], vectors[config.name] = measure(
                index, len(configs), config, settings, raw, run_id
            )
            runs += mine
        except (RuntimeError, ValueError, OSError) as err:
            failures.append(f"{config.name}: {err}")
            runner.say(f"[{index}/{len(configs)}] {config.name}: FAILED: {err}")
    if STOCK in vectors:
        for name, v in vectors.items():
            facts[name]["cosine_to_stock"] = round(cosine(v, vectors[STOCK]), 6)
    return runs, facts, failures


def meta(
    settings: Settings,
    run_id: str,
    started: float,
    load_before: tuple[float, float, float],
    failures: list[str],
) -> dict[str, Any]:
    return {
        **run_meta(settings, run_id, started, load_before, failures),
        "cpu": settings.cpu,
        "onnx_dir": str(settings.onnx_dir) if settings.onnx_dir else None,
    }


def run_embed(configs: list[Configuration], settings: Settings) -> tuple[dict[str, Any], int]:
    """Measure every configuration; write the outputs; (the result, the exit status)."""
    run_id = uuid.uuid4().hex[:8]
    settings = replace(settings, out_dir=settings.out_dir.resolve())
    with outputs.staged(settings.out_dir, "--out") as staging:
        raw = staging / "raw"
        raw.mkdir()
        raw.chmod(0o777)  # the image's client runs as an unprivileged user and writes here
        before, started, load_before = leftovers.found(), time.time(), os.getloadavg()
        try:
            runs, facts, failures = measure_all(configs, settings, raw, run_id)
            data = meta(settings, run_id, started, load_before, failures)
            images = settings.images
            result = embed_report.result_document(data, configs, images, runs, facts)
            embed_report.write_outputs(result, staging, plots=settings.plots)
            return result, (1 if failures else 0)
        finally:
            runner.remove_labelled(run_id)
            shutil.rmtree(raw / runner.RUN_CACHE, ignore_errors=True)
            leftovers.clean(before)
