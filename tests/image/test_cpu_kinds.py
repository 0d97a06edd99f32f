"""Every CPU kind users have, on whatever CPU this machine is: the launcher in a real
container of each image, under a faked /proc/cpuinfo (bind-mounted) for AMD Zen 3
(AVX2 only), AMD Zen 4 (AVX-512 BF16) and Intel with AMX.

The fake decides what the launcher and vLLM read from cpuinfo (vendor, flags); the
kernel's AMX answer and the real instructions stay this machine's, so the AMX
expectation is derived from both. `ZENVLLM_DRY_RUN=1` stops the launcher before it
execs vLLM; the zen image on a faked Zen 3 then serves a completion for real, the
INACTIVE branch end to end.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import cpu, engine
from support.tiny_model import ensure_tiny_model

from zenvllm.runtime import commands_status

pytestmark = pytest.mark.image

TARGETS = ("vllm-openai", "zen")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, str]:
    logs = tmp_path_factory.mktemp("cpu-kinds-builds")
    return {t: engine.build(t, logs / f"{t}.log")[0] for t in TARGETS}  # cache hits


@pytest.fixture(scope="module")
def views(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cpuinfo")
    cpus = len(cpu.this_host().cpus)
    out = {}
    for kind in cpu.KINDS:
        out[kind] = root / kind
        out[kind].write_text(cpu.fake_cpuinfo(kind, cpus))
    return out


def launch(image: str, cpuinfo: Path, *argv: str) -> str:
    done = engine.docker(
        *("run", "--rm", "--network", "none", "-e", "ZENVLLM_DRY_RUN=1"),
        *("-v", f"{cpuinfo}:/proc/cpuinfo:ro", "-v", f"{ensure_tiny_model()}:/model:ro"),
        *(image, "--model", "/model", "--max-model-len", "512", *argv),
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stderr


def amx_line(kind: str) -> str:
    if cpu.has_amx():  # the kernel offers tiles whatever cpuinfo claims
        return "AMX: tile permission requested at interpreter start (zenvllm.pth) and granted"
    if "amx_tile" in cpu.fake_host(kind).flags:
        return "AMX: /proc/cpuinfo lists amx_tile but the kernel offers no tile state"
    return "AMX: not on this CPU; nothing to request"


@pytest.mark.parametrize("kind", cpu.KINDS)
@pytest.mark.parametrize("target", TARGETS)
def test_the_launcher_reads_the_cpu_it_is_shown(images, views, kind, target):
    fake = cpu.fake_host(kind)
    log = launch(images[target], views[kind])
    assert f"vendor {fake.vendor}; isa {' '.join(sorted(fake.isa))}" in log, log
    assert f"zenvllm-launch: {amx_line(kind)}" in log, log
    kernels = "AVX-512" if "avx512f" in fake.flags else "AVX2"
    zen_active = fake.vendor == "AuthenticAMD" and {"avx512f", "avx512_bf16"} <= fake.flags
    platform = re.search(r"zenvllm-launch: vLLM platform: (.*)", log).group(1)
    if target == "vllm-openai":
        assert "zentorch" not in log
        assert platform == f"CpuPlatform (cpu) with its {kernels} kernels"
    elif zen_active:
        assert "zenvllm-launch: zentorch 2.13.0.1 is ACTIVE" in log, log
        assert platform == f"ZenCpuPlatform (cpu + zentorch) on {kernels} kernels"
    else:
        # It serves as vllm-openai would, and says so loudly, twice: the plan and zentorch.
        lacks = "avx512f, avx512_bf16" if fake.vendor == "AuthenticAMD" else "GenuineIntel"
        assert re.search(rf"zenvllm-launch: plan: target zen needs .*{lacks}", log), log
        assert re.search(
            rf"zenvllm-launch: WARNING: zentorch 2.13.0.1 is installed but INACTIVE: .*{lacks}",
            log,
        ), log
        assert platform == f"CpuPlatform (cpu) with its {kernels} kernels"
    assert "zenvllm-launch: dry run (ZENVLLM_DRY_RUN): would exec vllm serve /model" in log


@pytest.mark.parametrize("kind", ["amd-zen3-avx2", "intel-amx"])
def test_vllm_agrees_on_the_platform_it_picks(images, views, kind):
    # Only kinds where zentorch stays inactive: its kernels must not run on a CPU without
    # them, whatever the fake says.
    done = engine.docker(
        *("run", "--rm", "--network", "none", "-v", f"{views[kind]}:/proc/cpuinfo:ro"),
        *("--entrypoint", "python", images["zen"]),
        *("-c", "from vllm.platforms import current_platform as p; print(type(p).__name__)"),
    )
    assert done.stdout.split()[-1] == "CpuPlatform"


def test_zen_serves_a_completion_where_zentorch_is_inactive(images, views):
    """On every machine: the zen image under a faked Zen 3 serves for real on vLLM's
    stock platform, and `zenvllm status` (asking that vLLM) reports the stock backend
    as a silent fallback, in its view and in the metrics the drift alert reads."""
    port = engine.free_port()
    planned = engine.planned_as("cpu-kinds", "cpu-kinds-zen", "zen", port)
    with engine.serve(
        images["zen"],
        ensure_tiny_model(),
        port,
        "--enforce-eager",
        run_opts=("-v", f"{views['amd-zen3-avx2']}:/proc/cpuinfo:ro", *planned),
    ) as name:
        body = {"model": "/model", "prompt": "hello", "max_tokens": 5, "ignore_eos": True}

        def completion() -> dict | None:
            try:
                return engine.http_json(f"http://127.0.0.1:{port}/v1/completions", body, 30)
            except OSError:
                return None

        reply = engine.wait_for(completion, 420, "a completion from the zen image", name)
        assert reply["usage"]["completion_tokens"] == 5
        assert "WARNING: zentorch 2.13.0.1 is installed but INACTIVE" in engine.logs(name)
        rc, (row,), err = engine.status("cpu-kinds")
        assert (rc, row["backend"], row["platform"], row["health"]) == (
            1,
            "stock",
            "CpuPlatform",
            "ok",
        ), err
        assert row["problems"] == [
            "vLLM runs CpuPlatform (stock), not the zen target's ZenCpuPlatform: a silent fallback"
        ]
        assert row["amx"] == ("granted" if cpu.has_amx() else "none")  # as amx_line() says
        series = commands_status.exposition([row])
        assert 'target="zen",' in series and 'backend="stock",platform="CpuPlatform"} 1' in series
