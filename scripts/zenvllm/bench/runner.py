"""The one bench runner, for every model kind: each configuration's servers up
(bench/servers.py), measured by its kind (bench/kinds.py) with the run's clients
(bench/clients.py), removed; the result document written (bench/report.py); clean-up.

Every container it starts carries the label `io.zenvllm.bench=<run id>` and is
removed on the way out, whatever happens (errors, Ctrl-C, SIGTERM). Outputs
are written to a staging directory beside `--out` and renamed into place, so
an interrupted run never leaves a half-written result.
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

from zenvllm.bench import bandwidth, clients, document, gateway, leftovers, order, report, servers
from zenvllm.bench.catalogue import REFERENCE_KIND, STOCK
from zenvllm.bench.kinds import Kind
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.measuring import Measured, Settings, Stage
from zenvllm.bench.meta import run_meta
from zenvllm.bench.servers import say
from zenvllm.bench.workloads import AnyWorkload
from zenvllm.deploy import outputs


@dataclass
class Ran:
    """What the run measured so far, configuration by configuration."""

    rows: dict[str, list[dict[str, Any]]]  # the document's raw rows by key
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    probes: dict[str, tuple[float, ...]] = field(default_factory=dict)
    ordering: dict[str, Any] = field(default_factory=dict)  # meta.order (bench/order.py)

    def add(self, name: str, measured: Measured) -> None:
        for key, rows in measured.rows.items():  # a kind's keys beyond its raw ones too
            self.rows.setdefault(key, []).extend(rows)
        self.facts.setdefault(name, {}).update(measured.facts)  # its last visit gives them
        self.failures += measured.failures
        if measured.probe:
            self.probes[name] = measured.probe


def run_bench(
    kind: Kind[AnyWorkload], configs: list[Configuration], settings: Settings[AnyWorkload]
) -> tuple[dict[str, Any], int]:
    """Measure every configuration; write the outputs; return (result, exit status)."""
    run_id = uuid.uuid4().hex[:8]
    # docker -v needs an absolute path
    settings = replace(settings, out_dir=settings.out_dir.resolve())
    with outputs.staged(settings.out_dir, "--out") as staging:
        return measure_into(kind, staging, run_id, configs, settings)


def measure_into(
    kind: Kind[AnyWorkload],
    staging: Path,
    run_id: str,
    configs: list[Configuration],
    settings: Settings[AnyWorkload],
) -> tuple[dict[str, Any], int]:
    raw = staging / "raw"
    raw.mkdir()
    raw.chmod(0o777)  # the image's client runs as an unprivileged user and writes here
    before, started, load_before = leftovers.found(), time.time(), os.getloadavg()
    pool = clients.ClientPool(
        clients.Clients(
            settings.images["vllm-openai"],
            settings.model_dir,
            raw,
            run_id,
            settings.client_timeout_s,
        )
    )
    try:
        ran = measure_each(kind, configs, settings, raw, run_id, pool)
        ended = bandwidth.at_end(settings.bandwidth)
        if ended and settings.bandwidth:
            start = settings.bandwidth
            say(
                f"bandwidth at the end: {ended['bandwidth_end_gbs']:g} GB/s per core busy "
                f"copying, {ended.get('bandwidth_read_end_gbs', 0):g} reading (at the start: "
                f"{start.core_busy_gbs:g} and {start.read_busy_gbs:g})"
            )
        meta = {
            **run_meta(settings, run_id, started, load_before, ran.failures),
            "order": ran.ordering,
            **kind.meta(settings),
            **ended,
            **bandwidth.run_figures(settings.bandwidth, ended),
        }
        result = document.assemble(
            kind.name, meta, configs, settings.images, ran.rows, ran.facts, kind.derive
        )
        report.write_outputs(result, staging, plots=settings.plots)
        return result, (1 if ran.failures else 0)
    finally:
        pool.close()
        servers.remove_labelled(run_id)
        shutil.rmtree(raw / servers.RUN_CACHE, ignore_errors=True)
        removed = leftovers.clean(before)
        if removed:
            say(f"removed {len(removed)} OpenMP/vLLM leftover file(s)")


def measure_each(
    kind: Kind[AnyWorkload],
    configs: list[Configuration],
    settings: Settings[AnyWorkload],
    raw: Path,
    run_id: str,
    pool: clients.ClientPool,
) -> Ran:
    """Every configuration in the run's order (bench/order.py: a block of repeats each,
    or a round per repeat); one that fails is a failure and is not started again, the
    others still run. Then each configuration's answer to the kind's probe against
    stock's."""
    ran = Ran({key: [] for key in kind.raw})
    repeats = settings.workload.repeats
    rounds = order.visits(len(configs), repeats, settings.ordering)
    ran.ordering = order.recorded([c.name for c in configs], rounds, settings.ordering.mode)
    failed: set[str] = set()  # a configuration that fails is not started again
    if len(rounds) > 1 and not settings.workload.enforce_eager:
        compile_first(kind, configs, settings, raw, run_id)
    for number, visits in enumerate(rounds, 1):
        for visit in visits:
            config = configs[visit.index]
            if config.name in failed:
                continue
            tag = f"[{visit.index + 1}/{len(configs)}] {config.name}"
            if len(rounds) > 1:
                tag += f" (round {number}/{len(rounds)})"
            try:
                measured = measure(kind, config, settings, raw, run_id, pool, tag, visit)
                ran.add(config.name, measured)
            except (RuntimeError, ValueError, OSError) as err:
                failed.add(config.name)
                ran.failures.append(f"{config.name}: {err}")
                say(f"{tag}: FAILED: {err}")
    if STOCK in ran.probes:
        for name, probe in ran.probes.items():
            ran.facts[name]["cosine_to_stock"] = round(cosine(probe, ran.probes[STOCK]), 6)
    return ran


def compile_first(
    kind: Kind[AnyWorkload],
    configs: list[Configuration],
    settings: Settings[AnyWorkload],
    raw: Path,
    run_id: str,
) -> None:
    """In rounds, each configuration whose compile cache is cold is started once before
    the first round and stopped, unmeasured: a round whose servers compile measured 5 to
    6% under the later ones on the Zen 5 (docs/benchmarks.md), a drift on the first
    round alone that the rounds' order does not cancel. One that fails to start here
    fails again when measured, and is reported there. Not the float32 reference (scored,
    never timed), nor servers of their own --enforce-eager (they fill no cache)."""
    for config in configs:
        if not config.servers or config.kind == REFERENCE_KIND:
            continue
        if any("--enforce-eager" in s.serve_args for s in config.servers):
            continue
        specs = servers.launches(config, settings, raw, run_id, kind.profiled)
        if servers.cache_of(specs) != "cold":
            continue
        servers.clear_the_way(config)
        try:
            servers.start_servers(
                config, settings, raw, run_id, f"{config.name}: compiling first (not measured)",
                kind.profiled,
            )  # fmt: skip
        except (RuntimeError, ValueError, OSError) as err:
            say(f"{config.name}: compiling first failed: {err}")
        finally:
            servers.stop(f"{config.name}-compile", config.servers, raw)


def measure(
    kind: Kind[AnyWorkload],
    config: Configuration,
    settings: Settings[AnyWorkload],
    raw: Path,
    run_id: str,
    pool: clients.ClientPool,
    tag: str,
    visit: order.Visit,
) -> Measured:
    """One visit of a configuration: its servers started, its endpoints found (the
    gateway deployed), measured by its kind, its servers stopped (their logs kept)
    whatever happens."""
    servers.clear_the_way(config)
    try:
        started = {}
        if config.servers:
            started = servers.start_servers(config, settings, raw, run_id, tag, kind.profiled)
        endpoints = servers.config_endpoints(config, settings, raw, tag)
        stage = Stage(settings, raw, pool, endpoints, started, tag, visit)
        return kind.measure(config, stage)
    finally:
        servers.stop(config.name, config.servers, raw)
        if config.kind == "gateway" and settings.gateway_deploy:
            gateway.teardown(settings.gateway_deploy, raw)


def cosine(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
