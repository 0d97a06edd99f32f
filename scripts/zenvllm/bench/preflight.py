"""What the bench checks and says before it measures, whatever the model's kind
(bench/commands_bench.py): the request's paths, the images and their compiler, the host
in one line, the configurations as --dry-run prints them."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from zenvllm.bench import document, flags, layouts, metrics, workloads
from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.core.host import GIB, Host
from zenvllm.deploy import outputs
from zenvllm.image import render
from zenvllm.runtime.engine import DOCKER


def default_image(target: str) -> str:
    """The tag `zenvllm build --target T` gives its image."""
    config = render.load_config()
    return render.default_tag(config, render.resolve(config, target, {}, None))


def image_present(tag: str) -> bool:
    return DOCKER.ok("image", "inspect", tag, timeout=60)


def has_compiler(image: str) -> bool:
    """vLLM's default (torch.compile) mode needs a C++ compiler on the CPU (Inductor).
    A probe that could not run (the engine's 125-127) is an error, not "no compiler":
    it must not switch every configuration to eager mode unsaid."""
    probe = "command -v g++ || command -v c++"
    done = DOCKER.run("run", "--rm", "--network", "host", "--entrypoint", "sh", image, "-c", probe)
    if done.returncode in (0, 1):
        return done.returncode == 0
    raise UserError(
        f"could not look for a C++ compiler in {image} (`docker run` exited "
        f"{done.returncode}: {done.stderr.strip()[-300:]}); fix the engine or the image, "
        "or pass --compile to keep compiled mode without looking"
    )


def checked_paths(request: flags.BenchRequest) -> tuple[Path, Path, str]:
    """(the model's directory, the output directory, the compile cache's or ""): the
    request's paths, each checked before any work, --out first."""
    out, model, compile_cache = request.out, request.model, request.compile_cache
    outputs.check_output(out, "--out")
    if request.metrics_file:
        metrics.check_metrics_file(request.metrics_file)
    model_dir = gate.resolved(model, f"--model {model}", "give a local model directory")
    if not model_dir.is_dir():
        raise UserError(f"--model {model}: not a directory; give a local model directory")
    out_dir = gate.resolved(out, f"--out {out}", "give a directory")
    if not request.dry_run:  # a dry run writes nothing
        check_room(out_dir)
    cache = (
        str(gate.resolved(compile_cache, f"--compile-cache {compile_cache}", "give a directory"))
        if compile_cache
        else ""
    )
    return model_dir, out_dir, cache


# The free space a run asks of --out's filesystem before it measures anything: a run of
# three configurations in three rounds wrote 1.2 MB there (raw client files, tables,
# plots: docs/test-runs/2026-12-06-zen4-rounds), so room for several. A disk that fills
# later is still named when a write fails (console.os_error).
ROOM_BYTES = 8 * 2**20


def check_room(out_dir: Path) -> None:
    """Refuse a run whose outputs would not fit, before anything is measured: the free
    space of the filesystem `out_dir` will be made on (its nearest existing directory)."""
    there = next(p for p in (out_dir, *out_dir.parents) if p.is_dir())
    free = shutil.disk_usage(there).free
    if free < ROOM_BYTES:
        raise UserError(
            f"--out's filesystem has {free // 1024} KiB free ({there}), under the "
            f"{ROOM_BYTES // 2**20} MiB the bench asks for its outputs (a run of three "
            "configurations writes about 1.2 MB: its clients' raw files, tables and plots); "
            "nothing was measured; free space there or choose another path"
        )


def describe_host(host: Host) -> str:
    """The machine in one line, for the report's title and meta."""
    return (
        f"{host.cpu_name}, {len(host.allowed_cpus)} CPUs, "
        f"{len(host.nodes)} NUMA node(s), {host.mem_total_bytes / GIB:.0f} GiB"
    )


def print_plan(
    configs: list[layouts.Configuration],
    images: dict[str, str],
    workload: workloads.Workload | workloads.PoolingWorkload,
    notes: list[str],
) -> int:
    """--dry-run: what would run, as JSON, so it can be checked before hours of measuring."""
    plan = {
        "configurations": [document.config_dict(c, images.get(c.target)) for c in configs],
        "workload": asdict(workload),
        "notes": notes,
    }
    print(json.dumps(plan, indent=2))
    return 0
