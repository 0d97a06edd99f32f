"""The benchmark's side-effect edge: containers up, /health, clients (bench/clients.py)
for the throughput repeats and batch 1, results, clean-up.

Every container it starts carries the label `io.zenvllm.bench=<run id>` and is
removed on the way out, whatever happens (errors, Ctrl-C, SIGTERM). Outputs
are written to a staging directory beside `--out` and renamed into place, so
an interrupted run never leaves a half-written result.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from zenvllm.bench import (
    backend,
    catalogue,
    clients,
    document,
    gateway,
    launch,
    layouts,
    leftovers,
    meta,
    report,
    results,
)
from zenvllm.bench.gateway import Deployment
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.results import Run
from zenvllm.bench.roofline import Bandwidth
from zenvllm.bench.workloads import Workload
from zenvllm.core import request
from zenvllm.core.errors import UserError
from zenvllm.deploy import outputs
from zenvllm.runtime.engine import DOCKER
from zenvllm.runtime.health import healthy

# The roofline's meta when the bandwidth is unknown: no roofline rows.
NO_BANDWIDTH = {"core_bandwidth_gbs": 0.0, "bandwidth_source": "unknown"}
RUN_CACHE = "compile-cache"  # a run's own compile cache, under raw/, removed after it
# The image's user, as the request names it (build.yaml's uid: a unit test keeps them equal).
CONTAINER_USER = tuple(int(i) for i in request.DEFAULT.user.split(":"))


@dataclass(frozen=True)
class Settings:
    model_dir: Path
    model_name: str
    images: dict[str, str]  # target -> image tag
    workload: Workload
    max_model_len: int
    out_dir: Path
    gateway_url: str | None = None  # an existing deployment's gateway
    gateway_deploy: Deployment | None = None  # or one deploy.yml makes for this run
    start_timeout_s: float = 900.0
    client_timeout_s: float = 1800.0
    plots: bool = True
    host_label: str = ""
    notes: list[str] = field(default_factory=list)
    # For the roofline: what a decode step reads, and what a core can stream (None:
    # unknown, no roofline).
    weight_bytes: int = 0
    bandwidth: Bandwidth | None = None
    host_cores: int = 0
    gguf: dict[str, Path] = field(default_factory=dict)  # llama.cpp peers: GGUF type -> file
    # vLLM's compile cache for every vLLM server ("" = none: each start compiles).
    compile_cache_dir: str = ""
    serve_env: dict[str, str] = field(default_factory=dict)  # over the planner's env
    # What stock and the planner's layouts serve in (the guard compares runs where they match).
    stock_dtype: str = catalogue.STOCK_DTYPE
    plan_dtype: str = "bfloat16"
    restart: bool = True  # restart the planner's layout once: its warm time to ready


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def logs_tail(name: str, lines: int = 25) -> str:
    done = DOCKER.run("logs", "--tail", str(lines), name)
    return (done.stdout + done.stderr).strip()


# vLLM's API server can outlive a dead engine core and never answer /health.
ENGINE_FAILED = "Engine core initialization failed"


def wait_ready(names_ports: list[tuple[str, int]], timeout_s: float) -> float:
    """Poll /health until every server answers; fail fast when a container or its
    engine dies."""
    start = time.monotonic()
    pending = dict(names_ports)
    while pending:
        for name, port in list(pending.items()):
            if healthy(port):
                del pending[name]
                continue
            state = DOCKER.run("inspect", "-f", "{{.State.Status}}", name).stdout.strip()
            if state != "running":
                raise RuntimeError(f"{name} stopped ({state or 'gone'}):\n{logs_tail(name)}")
            if ENGINE_FAILED in logs_tail(name, 200):
                raise RuntimeError(f"{name}: vLLM's engine failed to start:\n{logs_tail(name)}")
        if not pending:
            break
        if time.monotonic() - start > timeout_s:
            names = ", ".join(pending)
            raise RuntimeError(
                f"{names} not healthy after {timeout_s:.0f} s:\n{logs_tail(next(iter(pending)))}"
            )
        time.sleep(1)
    return time.monotonic() - start


def gateway_endpoint(settings: Settings, raw: Path, tag: str) -> str:
    if settings.gateway_url:
        return settings.gateway_url.rstrip("/")
    d = settings.gateway_deploy
    assert d is not None
    say(
        f"{tag}: deploying with zenvllm's playbooks/deploy.yml "
        f"(gateway :{d.port}, instances :{d.base_port}+)"
    )
    start = time.monotonic()
    gateway.deploy(d, raw / "gateway-deploy.log")
    say(f"{tag}: deployed and verified in {time.monotonic() - start:.0f} s")
    return d.url


def measure(
    index: int,
    total: int,
    config: Configuration,
    settings: Settings,
    raw: Path,
    run_id: str,
    facts: dict[str, dict[str, Any]],
    setup: clients.ClientPool,
) -> tuple[list[Run], Run | str | None]:
    """Start a configuration, warm it up, run its repeats and batch 1 (with the run's
    clients, vLLM's own `vllm bench serve`), read back what ran, stop it: its runs, and
    its batch-1 run (None: not asked for; a string: why it failed, the runs stand). What
    ran and how it started go to facts[config.name]."""
    w = settings.workload
    counted = config.kind == "llamacpp"
    tag = f"[{index}/{total}] {config.name}"
    started = {}
    try:
        if config.servers:
            image = settings.images[config.target]
            started = start_servers(config, settings, image, raw, run_id, tag)
        endpoints = config_endpoints(config, settings, raw, tag)
        shares = w.shares(len(endpoints))
        if w.warmup_prompts:
            warm = [replace(s.repeat(0), num_prompts=max(1, s.warmup_prompts)) for s in shares]
            say(f"{tag}: warm-up, {w.warmup_prompts} prompts (not measured)")
            stem = f"{config.name}-warmup"
            clients.run_clients(setup, endpoints, warm, stem, counted)
        runs = []
        for repeat in range(1, w.repeats + 1):
            load = os.getloadavg()[0]
            stem = f"{config.name}-r{repeat}"
            mine = [s.repeat(repeat) for s in shares]
            done = clients.run_clients(setup, endpoints, mine, stem, counted)
            used = servers_memory(config.servers)
            run = results.combine(config.name, repeat, done, load, used, w.concurrency)
            runs.append(run)
            say(
                f"{tag}: repeat {repeat}/{w.repeats}: {run.output_tok_s:.1f} output tok/s, "
                f"TTFT {run.median_ttft_ms:.0f} ms, TPOT {run.median_tpot_ms:.1f} ms "
                f"(load {load:.2f})"
            )
        one: Run | str | None
        try:
            one = batch1(config, setup, endpoints, w, tag) if w.batch1_prompts else None
        except (RuntimeError, ValueError) as err:
            say(f"{tag}: batch 1 FAILED: {err}")
            one = f"batch 1: {err}"
        wait = partial(wait_ready, timeout_s=settings.start_timeout_s)
        facts[config.name] = backend.facts(config, raw, started, settings.restart, wait, say)
        return runs, one
    finally:
        stop(config.name, config.servers, raw)
        if config.kind == "gateway" and settings.gateway_deploy:
            gateway.teardown(settings.gateway_deploy, raw)


def batch1(
    config: Configuration,
    setup: clients.ClientPool,
    endpoints: list[tuple[str, str]],
    w: Workload,
    tag: str,
) -> Run | None:
    """Batch 1: one request at a time to the first instance, the latency an interactive
    user gets (the gateway has no instance of its own: through nginx it would measure
    nginx too)."""
    if not config.servers:
        return None
    load = os.getloadavg()[0]
    stem = f"{config.name}-batch1"
    counted = config.kind == "llamacpp"
    done = clients.run_clients(setup, endpoints[:1], [w.batch1()], stem, counted)
    run = results.combine(config.name, 1, done, load, concurrency=1)
    say(
        f"{tag}: batch 1, {w.batch1_prompts} prompts one at a time: "
        f"{run.output_tok_s:.1f} output tok/s, TTFT {run.median_ttft_ms:.0f} ms, "
        f"TPOT {run.median_tpot_ms:.1f} ms (load {load:.2f})"
    )
    return run


def start_servers(
    config: Configuration,
    settings: Settings,
    image: str,
    raw: Path,
    run_id: str,
    tag: str,
) -> dict[str, Any]:
    """Check every port is free before starting any server, so a clash is a clear error
    rather than a container that never turns healthy; then start them and wait: how
    long, and whether their compile cache was warm."""
    for s in config.servers:
        if port_in_use(s.port):
            raise UserError(
                f"port {s.port} is already in use (needed by {config.name}); stop what "
                "listens there or pass --base-port"
            )
    say(f"{tag}: starting {config.shape} ({image})")
    specs = []
    for s in config.servers:
        container = launch.container_settings(
            image,
            Path(s.model_dir) if s.model_dir else settings.model_dir,
            settings.max_model_len,
            settings.workload.enforce_eager,
            raw,
            profile_dir=backend.profile_dir(raw, config.name, s.name) if s.instance else None,
            # Stock keeps vLLM's own command but for a cache given with --compile-cache.
            compile_cache_dir=settings.compile_cache_dir
            or (str(raw / RUN_CACHE) if s.instance else ""),
            extra_env={**settings.serve_env, **dict(config.serve_env)},
            target=config.target,
        )
        spec = (
            launch.llamacpp_launch(
                s,
                image,
                settings.gguf[s.gguf],
                settings.max_model_len,
                settings.workload.concurrency,
                run_id,
            )
            if config.kind == "llamacpp"
            else launch.server_launch(s, container, run_id)
        )
        for path, text in spec.files.items():
            Path(path).write_text(text)
        for path in spec.dirs:
            made = Path(path)
            made.mkdir(parents=True, exist_ok=True)
            os.chown(made, *CONTAINER_USER)
        specs.append(spec)
    cache = backend.cache_state(tuple(d for spec in specs for d in spec.dirs))
    for spec in specs:
        DOCKER.run(*spec.argv, check=True)
    took = wait_ready([(s.name, s.port) for s in config.servers], settings.start_timeout_s)
    say(f"{tag}: ready in {took:.0f} s (compile cache: {cache})")
    return {"ready_s": round(took, 1), "compile_cache": cache}


def servers_memory(servers: tuple[layouts.Server, ...]) -> int:
    """What the servers hold in memory now, MiB (docker stats leaves the page cache out)."""
    if not servers:
        return 0
    names = [s.name for s in servers]
    done = DOCKER.run("stats", "--no-stream", "--format", "{{.MemUsage}}", *names, timeout=60)
    return results.memory_mib(done.stdout) if done.returncode == 0 else 0


def config_endpoints(
    config: Configuration, settings: Settings, raw: Path, tag: str
) -> list[tuple[str, str]]:
    """(base URL, served model name) per client: the gateway serves under its own model
    name, a server started here under the mount path."""
    if config.kind == "gateway":
        url = gateway_endpoint(settings, raw, tag)
        return [(url, clients.served_model(url))]
    return [(f"http://127.0.0.1:{s.port}", layouts.MODEL_MOUNT) for s in config.servers]


def stop(config: str, servers: tuple[layouts.Server, ...], raw: Path) -> None:
    """Keep each server's log, named by its configuration too (configurations reuse
    container names), then remove it."""
    for s in servers:
        log = DOCKER.run("logs", s.name, timeout=60)
        if log.returncode == 0:
            (raw / f"{config}-{s.name}.log").write_text(log.stdout + log.stderr)
        DOCKER.run("rm", "-f", s.name, timeout=120)


def remove_labelled(run_id: str) -> None:
    ids = DOCKER.run("ps", "-aq", "--filter", f"label={launch.BENCH_LABEL}={run_id}")
    for cid in ids.stdout.split():
        DOCKER.run("rm", "-f", cid, timeout=120)


def run_bench(
    configs: list[Configuration],
    settings: Settings,
    progress: Callable[[str], None] = say,
) -> tuple[dict[str, Any], int]:
    """Measure every configuration; write the outputs; return (result, exit status)."""
    run_id = uuid.uuid4().hex[:8]
    # docker -v needs an absolute path
    settings = replace(settings, out_dir=settings.out_dir.resolve())
    with outputs.staged(settings.out_dir, "--out") as staging:
        return _measure_into(staging, run_id, configs, settings, progress)


def _measure_into(
    staging: Path,
    run_id: str,
    configs: list[Configuration],
    settings: Settings,
    progress: Callable[[str], None],
) -> tuple[dict[str, Any], int]:
    raw = staging / "raw"
    raw.mkdir()
    raw.chmod(0o777)  # the image's client runs as an unprivileged user and writes here
    before = leftovers.found()
    started = time.time()
    load_before = os.getloadavg()
    setup = clients.ClientPool(
        clients.Clients(
            settings.images["vllm-openai"],
            settings.model_dir,
            raw,
            run_id,
            settings.client_timeout_s,
        )
    )
    try:
        runs, batch1_runs, failures, facts = _measure_each(
            configs, settings, raw, run_id, progress, setup
        )
        said = _meta(settings, run_id, started, load_before, failures)
        result = document.result_document(said, configs, settings.images, runs, batch1_runs, facts)
        report.write_outputs(result, staging, plots=settings.plots)
        return result, (1 if failures else 0)
    finally:
        setup.close()
        remove_labelled(run_id)
        shutil.rmtree(raw / RUN_CACHE, ignore_errors=True)
        removed = leftovers.clean(before)
        if removed:
            progress(f"removed {len(removed)} OpenMP/vLLM leftover file(s)")


def _measure_each(
    configs: list[Configuration],
    settings: Settings,
    raw: Path,
    run_id: str,
    progress: Callable[[str], None],
    setup: clients.ClientPool,
) -> tuple[list[Run], list[Run], list[str], dict[str, dict[str, Any]]]:
    """Every configuration in turn: (its runs, the batch-1 runs, the failures, what ran);
    a configuration that fails is a failure, the others still run."""
    runs: list[Run] = []
    batch1_runs: list[Run] = []
    failures: list[str] = []
    facts: dict[str, dict[str, Any]] = {}
    for index, config in enumerate(configs, 1):
        try:
            mine, one = measure(index, len(configs), config, settings, raw, run_id, facts, setup)
            runs += mine
            if isinstance(one, str):
                failures.append(f"{config.name} {one}")
            elif one:
                batch1_runs.append(one)
        except (RuntimeError, ValueError, OSError) as err:
            failures.append(f"{config.name}: {err}")
            progress(f"[{index}/{len(configs)}] {config.name}: FAILED: {err}")
        ran = facts.get(config.name, {}).get("backend", {})
        if ran.get("active") is False:  # never presented as what it is not
            failures.append(backend.describe(config.name, config.target, ran))
    return runs, batch1_runs, failures, facts


def _meta(
    settings: Settings,
    run_id: str,
    started: float,
    load_before: tuple[float, float, float],
    failures: list[str],
) -> dict[str, Any]:
    """The results' meta: the run, the host, the model, the workload; the load and wall
    time as the runs end."""
    return {
        **meta.run_meta(settings, run_id, started, load_before, failures),
        # The generation bench's own: the embedding bench's Settings has no dtypes.
        "stock_dtype": settings.stock_dtype,
        "plan_dtype": settings.plan_dtype,
        "serve_env": settings.serve_env,  # --serve-env: over the plan's env
        "weight_bytes": settings.weight_bytes,
        **(settings.bandwidth.meta() if settings.bandwidth else NO_BANDWIDTH),
        "host_cores": settings.host_cores,
    }
