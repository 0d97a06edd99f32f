"""The speed guard in CI: a real-shape model (Qwen2.5-0.5B's shape, random weights) in
vLLM's compiled mode, the planner's layout against stock in the planner's dtype, judged
against the recorded runs in docs/bench of the same dtypes (zenvllm.bench.guard); and,
measured in the same run, the plan sabotaged on purpose, without what makes it faster
than stock at one dtype (guard.SABOTAGED: stock's thread binding), which the guard must
fail. Ratios only: the machine is shared and noisy, absolute figures move.
The same run checks the performance model as bench.check checks every run: the plan's
output tokens/s within the model's bound of its prediction, and not so with the run's
bandwidth figure halved.
(One run of three configurations, not two of two: stock's compiled server is started
once.)

The compile caches are kept under $ZENVLLM_CACHE/compile-guard, so after the first
CI run on a machine every server starts warm.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, require, require_tool
from support.engine import ZENVLLM, build, docker, engine_env, engine_ready
from support.tiny_model import ensure_tiny_model

from zenvllm.bench import document, guard, kinds, predicted, roofline
from zenvllm.bench.catalogue import STOCK_DTYPE

pytestmark = pytest.mark.bench

IMAGE = "zenvllm/vllm-openai:0.32.0"
CACHE = Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm")) / "compile-guard"
BASE_PORT = 8701  # its own: the quick bench uses 8601+, make bench 8401+
# Short but real: 16 requests of 128 in / 128 out at concurrency 16, once (the
# recorded runs hold the spread).
WORKLOAD = ["--num-prompts", "16", "--concurrency", "16", "--warmup-prompts", "8"]
WORKLOAD += ["--repeats", "1", "--batch1-prompts", "0", "--no-restart", "--no-plots"]
# Stock in the planner's dtype: no emulated bf16 server on a CPU without bf16, where
# each costs minutes.
WORKLOAD += ["--stock-dtype", "plan"]
# Under the AVX2 view (tests/support/avx2_machine.py) a Xeon's cores take Zen 3's path
# but gain nothing from the binding: judged against the view's own runs, and sabotaged
# of the planner's dtype instead (the plan in stock's bf16).
VIEW = bool(os.environ.get("ZENVLLM_TEST_AVX2_VIEW"))
SABOTAGED = "auto-stock-dtype" if VIEW else guard.SABOTAGED
RECORDED = guard.VIEW_RECORDED if VIEW else guard.RECORDED


def bench(out: Path, model: Path, *args: str) -> subprocess.CompletedProcess:
    # Speed only: its quality is the quick run's to check (test_bench_quick.py).
    argv = [
        *ZENVLLM,
        "bench",
        "--model",
        str(model),
        "--out",
        str(out),
        "--compile",
        "--no-quality",
    ]
    argv += ["--compile-cache", str(CACHE), "--base-port", str(BASE_PORT), *WORKLOAD, *args]
    done = subprocess.run(argv, env=engine_env(), text=True, capture_output=True, timeout=1800)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def guard_of(out: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [ZENVLLM[0], "-m", "zenvllm.bench.guard", str(out), "--recorded", str(RECORDED)]
    argv += args
    return subprocess.run(argv, env=engine_env(), text=True, capture_output=True)


@pytest.fixture(scope="module")
def model():
    require_tool("docker")
    require(engine_ready(), "no container engine answers (make engine)")
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        build("vllm-openai", REPO / ".cache" / "guard-build.log")  # a cache hit once built
    return ensure_tiny_model(shape="qwen0.5b")


@pytest.fixture(scope="module")
def measured(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("guard") / "run"
    bench(out, model, "--configs", f"stock,auto,{SABOTAGED}")
    return json.loads((out / "results.json").read_text()), out


def test_the_planners_advantage_holds_against_the_recorded_runs(measured, model, tmp_path):
    """The configurations are measured one after the other, so a burst of load from
    outside the VM can fall on one of them alone (seen once on a quiet 2-core Zen 4:
    auto / stock 1.09x, then 1.70x on the same image minutes later). A run below the
    floor is measured once more, stock and auto afresh, and the guard fails only if the
    second run is below it too: a real regression fails both."""
    doc, out = measured
    assert doc["meta"]["workload"]["enforce_eager"] is False  # compiled, as deployments run
    done, first = guard_of(out), ""
    print(f"\n{done.stdout}")
    if done.returncode == 1:
        again = tmp_path / "again"
        bench(again, model, "--configs", "stock,auto")
        first, done = f"first run: {done.stdout}second run: ", guard_of(again)
        print(f"measured again: {done.stdout}")
    assert done.returncode == 0, first + done.stdout + done.stderr
    assert done.stdout.startswith("speed guard holds: auto / stock = ")


def test_the_guard_fails_a_plan_sabotaged_of_its_gain_on_this_cpu(measured):
    """The planner's layout given stock's thread binding (under the AVX2 view, stock's
    dtype), stock and the plan beside it in the same run, all measured for real: judged
    as the plan, the guard says FAILED and exits 1."""
    doc, out = measured
    (config,) = [c for c in doc["configurations"] if c["name"] == SABOTAGED]
    logs = list((out / "raw").glob(f"{SABOTAGED}-zenvllm-bench-*.log"))  # its servers'
    assert logs, SABOTAGED
    if SABOTAGED == "auto-stock-bind":
        assert {s["omp_bind"] for s in config["servers"]} == {"auto"}, config
        wanted = "VLLM_CPU_OMP_THREADS_BIND=auto (the deployment's plan)"
    else:  # the launcher's exec line serves stock's dtype, the plan's float32 elsewhere
        wanted = f"--dtype={STOCK_DTYPE}"
    assert all(wanted in log.read_text() for log in logs), (wanted, logs)
    judged = guard_of(out, "--config", SABOTAGED)
    print(f"\nsabotaged: {judged.stdout}")
    assert judged.returncode == 1, judged.stdout + judged.stderr
    assert judged.stdout.startswith(f"speed guard FAILED: {SABOTAGED} / stock = ")


def bandwidth_scaled(doc: dict, scale: float) -> dict:
    """The run as if its bandwidth measurements (at its start and its end) were `scale`
    times what they measured."""
    sabotaged = copy.deepcopy(doc)
    meta = sabotaged["meta"]
    for key in ("core_bandwidth_gbs", "core_alone_gbs", "bandwidth_start_gbs", "bandwidth_end_gbs"):
        if meta.get(key):
            meta[key] *= scale
    return sabotaged


def test_the_performance_model_holds_on_this_run_and_fails_with_its_bandwidth_off_by_2x(
    measured,
):
    """The 0.5 B shape outgrows any L3, so its plan (auto) is checked: its measured output
    tokens/s within the model's bound of the prediction from this run's own bandwidth
    figure; with that figure off by 2x, off it. At 16 sequences a step is mostly
    arithmetic on a CPU with bf16 (Zen 4: 57 of 104 ms), so 2x moves the prediction by
    about a quarter, near the bound: one way is caught, and which depends on where this
    run's figure and error sit (the Zen 5 rounds runs: doubled in one, halved in the
    other; test_bench_predicted holds them to it). Both are printed, and the figure
    measured again at the run's end."""
    doc, _ = measured
    rows = {r["config"]: r for r in document.derive(doc)["predictions"]}
    print(f"\n{predicted.predictions_table(list(rows.values()))}")
    figure = doc["meta"]["core_bandwidth_gbs"]  # the higher of the start's and the end's
    print(f"bandwidth: the run's {figure:g} GB/s per core busy{roofline.end_note(doc['meta'])}")
    # Within the bound of a prediction from the run's figure, or from its lower one where
    # the machine changed during the run (bench/predicted.lowest_figure).
    assert rows["auto"]["within"] is True, rows["auto"]
    assert kinds.GENERATION_KIND.derived_problems(doc) == []
    caught = {}
    for scale in (0.5, 2.0):
        problems = kinds.GENERATION_KIND.derived_problems(bandwidth_scaled(doc, scale))
        caught[scale] = [p for p in problems if p.startswith("auto: predicted ")]
        print(f"bandwidth x{scale:g}: {caught[scale] or 'within the bound'}")
    assert any("beyond the performance model's bound" in p for p in caught[0.5] + caught[2.0])
