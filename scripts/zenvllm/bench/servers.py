"""The bench's servers, its side-effect edge for every model kind: ports checked, each
configuration's containers started (vLLM's guide's command, the deployment's container,
or a peer's own) and waited for on /health, the gateway deployed, logs kept, everything
removed.

Every container it starts carries the label `io.zenvllm.bench=<run id>`; bench/runner.py
removes them on the way out, whatever happens (errors, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from zenvllm.bench import backend, clients, gateway, launch, layouts, results
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.measuring import Settings
from zenvllm.bench.workloads import AnyWorkload
from zenvllm.core import request
from zenvllm.core.errors import UserError
from zenvllm.runtime.engine import DOCKER
from zenvllm.runtime.health import healthy

RUN_CACHE = "compile-cache"  # a run's own compile cache, under raw/, removed after it
# The image's user, as the request names it (build.yaml's uid: a unit test keeps them equal).
CONTAINER_USER = tuple(int(i) for i in request.DEFAULT.user.split(":"))


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


def gateway_endpoint(settings: Settings[AnyWorkload], raw: Path, tag: str) -> str:
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


def launch_of(
    server: layouts.Server,
    config: Configuration,
    settings: Settings[AnyWorkload],
    raw: Path,
    run_id: str,
    profiled: bool,
) -> launch.Launch:
    """How one server starts: a peer's own command (llama.cpp's, infinity's), vLLM's
    guide's (stock) or the deployment's container (the planner's), with a compile cache
    of the run's own; `profiled`: the planner's containers with vLLM's profiler, idle
    until bench/backend.py asks."""
    image = settings.images[config.target]
    if config.kind == "llamacpp":
        gguf = settings.gguf[server.gguf]
        slots = settings.workload.concurrency
        return launch.llamacpp_launch(server, image, gguf, settings.max_model_len, slots, run_id)
    if config.kind == "infinity":
        assert settings.onnx_dir is not None
        return launch.infinity_launch(server, image, settings.onnx_dir, run_id)
    container = launch.container_settings(
        image,
        Path(server.model_dir) if server.model_dir else settings.model_dir,
        settings.max_model_len,
        settings.workload.enforce_eager,
        raw,
        profile_dir=backend.profile_dir(raw, config.name, server.name)
        if server.instance and profiled
        else None,
        # Stock keeps vLLM's own command but for a cache given with --compile-cache.
        compile_cache_dir=settings.compile_cache_dir
        or (str(raw / RUN_CACHE) if server.instance else ""),
        extra_env={**settings.serve_env, **dict(config.serve_env)},
        target=config.target,
    )
    return launch.server_launch(server, container, run_id)


def launches(
    config: Configuration,
    settings: Settings[AnyWorkload],
    raw: Path,
    run_id: str,
    profiled: bool,
) -> list[launch.Launch]:
    """How each of the configuration's servers starts (launch_of)."""
    return [launch_of(s, config, settings, raw, run_id, profiled) for s in config.servers]


def cache_of(specs: list[launch.Launch]) -> str:
    """Whether the servers' compile cache is warm, cold or none (backend.cache_state)."""
    return backend.cache_state(tuple(d for spec in specs for d in spec.dirs))


def clear_the_way(config: Configuration) -> None:
    """Before any of its servers starts, and outside what stop() cleans up after them
    (which removes by name): every port free, so a clash is a clear error rather than a
    container that never turns healthy, and every name free or held by a bench run's
    stopped leftover, removed."""
    for s in config.servers:
        if port_in_use(s.port):
            raise UserError(
                f"port {s.port} is already in use (needed by {config.name}); stop what "
                "listens there or pass --base-port"
            )
        clear_name(s.name, config.name)


def start_servers(
    config: Configuration,
    settings: Settings[AnyWorkload],
    raw: Path,
    run_id: str,
    tag: str,
    profiled: bool,
) -> dict[str, Any]:
    """Start the configuration's servers (clear_the_way first) and wait: how long, and
    whether their compile cache was warm."""
    say(f"{tag}: starting {config.shape} ({settings.images[config.target]})")
    specs = launches(config, settings, raw, run_id, profiled)
    for spec in specs:
        for path, text in spec.files.items():
            Path(path).write_text(text)
        for path in spec.dirs:
            made = Path(path)
            made.mkdir(parents=True, exist_ok=True)
            os.chown(made, *CONTAINER_USER)
    cache = cache_of(specs)
    for spec in specs:
        DOCKER.run(*spec.argv, check=True)
    took = wait_ready([(s.name, s.port) for s in config.servers], settings.start_timeout_s)
    say(f"{tag}: ready in {took:.0f} s (compile cache: {cache})")
    return {"ready_s": round(took, 1), "compile_cache": cache}


# What `docker inspect` says of a container under a name a server needs.
STATE_FORMAT = f'{{{{.State.Running}}}} {{{{index .Config.Labels "{launch.BENCH_LABEL}"}}}}'


def in_the_way(name: str, config: str, inspected: str) -> str:
    """The bench run whose stopped container holds `name` (`inspected`: STATE_FORMAT's
    line), which a run killed past its clean-up leaves (CI's time limit, 2026-12-07) and
    the bench removes; anything else under the name is refused, the way out named."""
    running, _, run_id = inspected.strip().partition(" ")
    run_id = "" if run_id == "<no value>" else run_id
    if running == "false" and run_id:
        return run_id
    whose = f"still running, of bench run {run_id}" if run_id else "not zenvllm bench's"
    raise UserError(
        f"a container named {name} already exists ({whose}), and {config} needs the name; "
        f"remove it (docker rm -f {name}) or pass --base-port"
    )


def clear_name(name: str, config: str) -> None:
    found = DOCKER.run("inspect", "--type", "container", "--format", STATE_FORMAT, name)
    if found.returncode == 0:  # else: no container of that name
        run_id = in_the_way(name, config, found.stdout)
        say(f"removing {name}: a stopped container bench run {run_id} left behind")
        remove(name)


def servers_memory(servers: tuple[layouts.Server, ...]) -> int:
    """What the servers hold in memory now, MiB (docker stats leaves the page cache out)."""
    if not servers:
        return 0
    names = [s.name for s in servers]
    done = DOCKER.run("stats", "--no-stream", "--format", "{{.MemUsage}}", *names, timeout=60)
    return results.memory_mib(done.stdout) if done.returncode == 0 else 0


def config_endpoints(
    config: Configuration, settings: Settings[AnyWorkload], raw: Path, tag: str
) -> list[tuple[str, str]]:
    """(base URL, served model name) per client: the gateway serves under its own model
    name, a server started here under the mount path."""
    if config.kind == "gateway":
        url = gateway_endpoint(settings, raw, tag)
        return [(url, clients.served_model(url))]
    return [(f"http://127.0.0.1:{s.port}", layouts.MODEL_MOUNT) for s in config.servers]


def stop(config: str, servers: tuple[layouts.Server, ...], raw: Path) -> None:
    """Keep each server's log, named by its configuration too (configurations reuse
    container names), then remove it: removed even where its log cannot be kept (a full
    disk under --out), since the next configuration may need its port."""
    for s in servers:
        try:
            log = DOCKER.run("logs", s.name, timeout=60)
            if log.returncode == 0:
                (raw / f"{config}-{s.name}.log").write_text(log.stdout + log.stderr)
        finally:
            remove(s.name)


def remove_labelled(run_id: str) -> None:
    ids = DOCKER.run("ps", "-aq", "--filter", f"label={launch.BENCH_LABEL}={run_id}")
    for cid in ids.stdout.split():
        remove(cid)


def remove(container: str, within_s: float = 60) -> None:
    """Remove a container, asking again until it is gone: a run interrupted while
    `docker run` starts it leaves the engine starting it, and `rm -f` of a container
    still starting fails (an interrupted run left its first server running)."""
    deadline = time.monotonic() + within_s
    while True:
        DOCKER.run("rm", "-f", container, timeout=120)
        if not DOCKER.run("inspect", "--format", "{{.Id}}", container).stdout.strip():
            return
        if time.monotonic() > deadline:
            say(f"container {container} could not be removed: docker rm -f {container}")
            return
        time.sleep(1)
