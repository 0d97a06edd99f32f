"""Measure this host's memory bandwidth, the figure the planner's core rule rests on.

A decode step reads every weight once, so what a slice of cores can stream from
memory sets its speed. Each figure is measured by one process per physical core
pinned with sched_setaffinity, on buffers far larger than a core's share of L3: first
one core alone, then every core of each NUMA node at once. Twice over:
- a STREAM-like copy (memmove), counted as bytes read plus bytes written: the figure
  the planner and its performance model use (their constants were fitted on it);
- a read-only stream (memcmp of two equal buffers, which only reads), as a decode step
  reads its weights: the roofline's ceiling. A copy spends part of the memory's time
  writing, so a decode step can read faster than the copy's figure (the 1.5 B shape's
  batch 1 read 106.7% of it on a Zen 5: docs/bench/qwen1.5b-rounds).
Standard library only (ctypes' memmove and bytes' comparison are libc's memmove and
memcmp), so it runs on any host the planner runs on, in seconds.

With a model, the decode step's floor too: every core of the first node reads its
share of the model's safetensors data at once (from the page cache, warmed by a
first pass), timed per pass. That is the weight traffic of one step of an instance
spanning the node; the bench's TPOT is the whole step (attention, sampling, Python).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from zenvllm.core import gate
from zenvllm.core.calibration import DEFAULT_PATH, Calibration, NodeFigure, StepFigure, parse
from zenvllm.core.cores import usable_cores
from zenvllm.core.errors import UserError
from zenvllm.core.host import GIB, MIB, Host
from zenvllm.core.model import read_model, safetensors_spans, shards

if TYPE_CHECKING:  # the types of what a fork context makes, imported only to name them
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

READ_CHUNK = 4 * MIB  # read into a buffer that stays in the core's L2/L3
Span = tuple[str, int, int]  # file, first byte, end

BUFFER_MIB = 64  # per buffer, two per process: beyond any core's share of an L3
# Cores measured "at once" must have been: a CPU taken away for seconds (a VM's vCPU
# stolen by its host, a neighbour's burst) can run the copies one after the other, each
# at one core's speed alone, and their sum then counts a core twice.
OVERLAP = 0.9  # of the measuring time, common to every process
TRIES = 3
Window = tuple[float, float, float]  # began, ended (the monotonic clock), the figure


def copy_rate(
    cpu: int, nbytes: int, seconds: float, start: Barrier, results: Queue[Window]
) -> None:
    """In a child process: memmove on one CPU for `seconds`; bytes moved per second, with
    when it measured."""
    os.sched_setaffinity(0, {cpu})
    src = ctypes.create_string_buffer(nbytes)  # zero-filled: every page is touched
    dst = ctypes.create_string_buffer(nbytes)
    ctypes.memmove(dst, src, nbytes)
    start.wait()
    moved, began = 0, time.perf_counter()
    while (now := time.perf_counter()) - began < seconds:
        ctypes.memmove(dst, src, nbytes)
        moved += 2 * nbytes  # read once, written once
    results.put((began, now, moved / (now - began)))


def read_rate(
    cpu: int, nbytes: int, seconds: float, start: Barrier, results: Queue[Window]
) -> None:
    """In a child process: compare two equal buffers on one CPU for `seconds` (libc's
    memcmp reads both to their last byte, and writes nothing); bytes read per second,
    with when it measured."""
    os.sched_setaffinity(0, {cpu})
    first = bytearray(b"\x5a") * nbytes  # written: no page is the shared zero page
    second = bytearray(first)
    start.wait()
    read, began = 0, time.perf_counter()
    while (now := time.perf_counter()) - began < seconds:
        if first != second:  # never: the comparison is the work
            raise AssertionError("the buffers differ")
        read += 2 * nbytes
    results.put((began, now, read / (now - began)))


def in_parallel(
    work: Callable[..., None], jobs: Sequence[tuple[object, ...]], timeout: float
) -> list[Window]:
    """`work(*job, start, results)` in one forked process per job, released together by
    a barrier; what each put in `results`."""
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Barrier(len(jobs)), ctx.Queue()
    procs = [ctx.Process(target=work, args=(*job, start, results)) for job in jobs]
    for proc in procs:
        proc.start()
    try:
        return [results.get(timeout=timeout) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def at_once(
    work: Callable[..., None],
    jobs: Sequence[tuple[object, ...]],
    seconds: float,
    timeout: float,
    run: Callable[..., list[Window]] = in_parallel,
) -> list[Window]:
    """`run(work, jobs, timeout)` again until its processes measured together for
    OVERLAP of `seconds`; refused after TRIES."""
    for _ in range(TRIES):
        windows = run(work, jobs, timeout)
        together = min(end for _, end, _ in windows) - max(began for began, _, _ in windows)
        if together >= OVERLAP * seconds:
            return windows
    cpus = [job[0] for job in jobs]
    raise UserError(
        f"the processes on CPUs {cpus} did not run at once in {TRIES} tries (for "
        f"{OVERLAP:.0%} of {seconds:g} s): other work took those CPUs; measure again on "
        "a quiet machine"
    )


def measure(
    cpus: list[int],
    nbytes: int,
    seconds: float,
    run: Callable[..., list[Window]] = in_parallel,
    work: Callable[..., None] = copy_rate,
) -> float:
    """Aggregate GB/s of `cpus` at once (one process each), copying or (`read_rate`)
    reading."""
    jobs = [(c, nbytes, seconds) for c in cpus]
    windows = at_once(work, jobs, seconds, seconds + 60, run)
    return sum(rate for *_, rate in windows) / 1e9


def data_spans(model_dir: Path) -> list[Span]:
    """Each safetensors file's tensor data: everything after its header."""
    spans = []
    for path in shards(model_dir):
        data_start, tensors = safetensors_spans(path)
        spans.append((str(path), data_start, data_start + max((e for _, e in tensors), default=0)))
    return spans


def split(spans: list[Span], parts: int) -> list[list[Span]]:
    """`spans` cut into `parts` runs of (nearly) equal bytes, in order."""
    total = sum(end - start for _, start, end in spans)
    share, out, current, room = -(-total // parts), [], [], -(-total // parts)
    for path, start, end in spans:
        while start < end:
            take = min(room, end - start)
            current.append((path, start, start + take))
            start, room = start + take, room - take
            if room == 0:
                out.append(current)
                current, room = [], share
    if current:
        out.append(current)
    return out


def read_pass(spans: list[Span], buf: bytearray) -> None:
    view = memoryview(buf)
    for path, start, end in spans:
        with gate.regular(Path(path), "give a model directory of regular files") as (f, _):
            while start < end:
                got = os.preadv(f.fileno(), [view[: min(len(buf), end - start)]], start)
                if got <= 0:
                    raise OSError(f"{path}: short read at byte {start}")
                start += got


def pass_time(
    cpu: int, spans: list[Span], seconds: float, start: Barrier, results: Queue[Window]
) -> None:
    """In a child process: read its spans on one CPU, again and again for `seconds`;
    seconds per pass, with when it measured."""
    os.sched_setaffinity(0, {cpu})
    buf = bytearray(READ_CHUNK)
    read_pass(spans, buf)  # from disk into the page cache, if it was not there
    start.wait()
    passes, began = 0, time.perf_counter()
    while (now := time.perf_counter()) - began < seconds or passes == 0:
        read_pass(spans, buf)
        passes += 1
    results.put((began, now, (now - began) / passes))


def measure_step(model_dir: Path, host: Host, seconds: float) -> StepFigure:
    """The first node's cores reading the model's weights at once, each its share."""
    model = read_model(model_dir)
    if model.weight_bytes > host.mem_available_bytes // 2:
        raise UserError(
            f"--model {model_dir}: {model.weight_gib:.1f} GiB of weights, over half the "
            f"{host.mem_available_bytes / GIB:.1f} GiB available now: the page cache could "
            "not hold them while measuring; measure without --model, or free memory first"
        )
    cpus = [ids[0] for ids in next(iter(usable_cores(host).values()))]
    shares = split(data_spans(model_dir), len(cpus))
    jobs = [(cpu, share, seconds) for cpu, share in zip(cpus, shares, strict=False)]
    windows = at_once(pass_time, jobs, seconds, seconds + 120)  # + the first read from disk
    slowest = max(per_pass for *_, per_pass in windows)
    return StepFigure(model.name, model.weight_bytes, len(shares), round(slowest * 1000, 2))


def buffer_bytes(host: Host, processes: int) -> int:
    """BUFFER_MIB, or less when two buffers per process would take over a quarter of the
    memory available now."""
    room = host.mem_available_bytes // 4 // (2 * processes)
    size = min(BUFFER_MIB * MIB, room)
    if size < 8 * MIB:
        raise UserError(
            f"only {host.mem_available_bytes // MIB} MiB available: calibrate needs 16 MiB "
            f"per core ({processes} cores); free memory or stop other workloads first"
        )
    return size


def calibrate(host: Host, seconds: float = 2.0, models: tuple[Path, ...] = ()) -> Calibration:
    """One core alone, then each node's cores at once (one logical CPU per core), copying
    and then reading; then each model's weight read."""
    per_node = {node: [ids[0] for ids in cores] for node, cores in usable_cores(host).items()}
    if not per_node:
        raise UserError("no usable CPUs to measure: the cpuset allows none of the online CPUs")
    nbytes = buffer_bytes(host, max(len(c) for c in per_node.values()))
    first = next(iter(per_node.values()))
    alone = measure(first[:1], nbytes, seconds)
    copied = {node: measure(c, nbytes, seconds) for node, c in per_node.items()}
    read_alone = measure(first[:1], nbytes, seconds, work=read_rate)
    read = {node: measure(c, nbytes, seconds, work=read_rate) for node, c in per_node.items()}
    return Calibration(
        cpu_model=host.cpu_name,
        cpus=len(host.allowed_cpus),
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        method=(
            f"memmove copy of {nbytes // MIB} MiB buffers, {seconds:g} s per measurement, "
            "one process per physical core, bytes read + written; read only: memcmp of "
            "two such buffers, bytes read"
        ),
        core_alone_gbs=round(alone, 2),
        nodes={
            node: NodeFigure(len(c), round(copied[node], 2), round(read[node], 2))
            for node, c in per_node.items()
        },
        steps=tuple(measure_step(m, host, seconds) for m in models),
        read_alone_gbs=round(read_alone, 2),
    )


def read(path: Path | None, live: bool) -> tuple[Calibration | None, str]:
    """The calibration to plan with and where it came from: `path` if given (it must
    exist), else DEFAULT_PATH when planning the live host and it exists, else none."""
    if path is None:
        if not live or not Path(DEFAULT_PATH).is_file():
            return None, ""
        path = Path(DEFAULT_PATH)
    text = gate.read_text(path, gate.SMALL, "give --calibration a file `zenvllm calibrate` wrote")
    return parse(text, str(path)), str(path)
