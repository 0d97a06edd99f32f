"""`zenvllm bench --quick` end to end: real containers, real `vllm bench serve`, real files.

Asserts structure and consistency only (every configuration present, each
ratio the quotient of the numbers beside it, CSV = JSON, batch 1 measured and
consistent with itself, the bandwidth measured, real PNGs, nothing left behind).
How fast a layout is depends on the machine's load: that claim is checked on the
full run's result file, not here.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from conftest import REPO, require, require_tool
from support.engine import ZENVLLM, build, docker, engine_env, engine_ready
from support.tiny_model import ensure_tiny_model

from zenvllm.bench import catalogue, check, gateway, launch, workloads

pytestmark = pytest.mark.bench

IMAGE = "zenvllm/vllm-openai:0.32.0"
QUICK_TIMEOUT_S = 1500
DEAD_RUN = f"{launch.BENCH_LABEL}=0dead000"  # a run that no longer runs
# Ports of its own, so a `make bench` running on the defaults (8401+) is left alone.
BASE_PORT = 8601


def engine(*args: str) -> subprocess.CompletedProcess:
    return docker(*args, check=False)


def bench_containers(run_id: str = "") -> list[str]:
    label = f"label={launch.BENCH_LABEL}" + (f"={run_id}" if run_id else "")
    return engine("ps", "-a", "--filter", label, "-q").stdout.split()


def named(name: str) -> list[str]:
    return engine("ps", "-a", "--filter", f"name={name}", "-q").stdout.split()


def leftovers() -> set[Path]:
    return set(Path("/dev/shm").glob("__KMP_REGISTERED_LIB_*")) | set(
        Path("/tmp").glob("vllm_dist_*")
    )


def zenvllm_bench(*args: str, timeout: float = QUICK_TIMEOUT_S, **kw):
    return subprocess.run(
        [*ZENVLLM, "bench", *args], env=engine_env(), text=True, timeout=timeout, **kw
    )


@pytest.fixture(scope="module")
def prerequisites():
    require_tool("docker")
    playbook = Path(sys.executable).parent / "ansible-playbook"
    require(playbook.exists(), f"{playbook} missing (make venv): the gateway runs deploy.yml")
    require(engine_ready(), "no container engine answers (make engine)")
    if engine("image", "inspect", IMAGE).returncode != 0:
        build("vllm-openai", REPO / ".cache" / "bench-build.log")  # a cache hit once built
    # The llama.cpp peer, compiled for this CPU: ~6 min the first time on a CPU kind.
    build("llamacpp", REPO / ".cache" / "bench-peer-build.log")
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def nginx_before() -> int | None:
    """nginx's master before the run: the gateway's deploy starts nginx if none runs."""
    return gateway.nginx_master()


@pytest.fixture(scope="module")
def quick(prerequisites, nginx_before, tmp_path_factory):
    work = tmp_path_factory.mktemp("bench")
    out = work / "out"
    before = leftovers()
    # What a run killed past its clean-up leaves (CI's time limit did, 2026-12-07): a
    # stopped container of its own under the name the plan's first server takes.
    engine("create", "--name", f"zenvllm-bench-{BASE_PORT}-0", "--label", DEAD_RUN, IMAGE)
    start = time.monotonic()
    # A relative --out, as `make bench` passes it (docker needs absolute mount paths).
    args = ["--quick", "--gateway", "deploy", "--base-port", str(BASE_PORT)]
    args += ["--model", str(prerequisites), "--out", "out"]
    done = zenvllm_bench(*args, capture_output=True, cwd=work)
    took = time.monotonic() - start
    print(f"\nzenvllm bench --quick: exit {done.returncode} in {took:.0f} s\n{done.stdout}")
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    return out, done.stdout, before


def test_progress_is_shown_while_it_runs(quick):
    _, stdout, _ = quick
    for name in catalogue.QUICK_CONFIGS:
        assert f"] {name}: repeat 1/1:" in stdout
    assert "] stock: starting 1 x all CPUs" in stdout
    assert "] gateway: deploying with zenvllm's playbooks/deploy.yml" in stdout
    assert "warm-up" in stdout
    assert "| Model | stock |" in stdout  # the table is printed at the end


def test_a_stopped_container_an_earlier_run_left_is_removed_before_its_name_is_taken(quick):
    _, stdout, _ = quick
    name = f"zenvllm-bench-{BASE_PORT}-0"
    assert f"removing {name}: a stopped container bench run 0dead000 left behind" in stdout
    assert bench_containers("0dead000") == []


def test_a_container_not_the_benchs_under_a_name_it_needs_is_refused_and_kept(
    prerequisites, tmp_path
):
    """Refused before any server starts, exit 2, the container named with the way out,
    and kept as it was: the bench removes only its own runs' stopped containers."""
    port = BASE_PORT + 70
    theirs = f"zenvllm-bench-reference-{port}"  # the quick run's first server
    engine("create", "--name", theirs, IMAGE)
    try:
        done = zenvllm_bench(
            *("--quick", "--configs", "stock", "--base-port", str(port)),
            *("--model", str(prerequisites), "--out", str(tmp_path / "out")),
            capture_output=True,
            timeout=300,
        )
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
        says = done.stdout + done.stderr
        assert f"a container named {theirs} already exists (not zenvllm bench's)" in says
        assert f"docker rm -f {theirs}" in says and "Traceback" not in says
        assert len(named(theirs)) == 1 and not (tmp_path / "out").exists()
        assert named(f"zenvllm-bench-stock-{port}") == []
    finally:
        engine("rm", "-f", theirs)


def test_batch1_is_measured_for_each_configuration_with_servers(quick):
    """One request at a time to the first instance of every configuration with servers
    of its own (the gateway has none), its figures in the summary and the tables, and
    consistent with themselves: requests one at a time never overlap, so the run lasts
    at least the sum of each request's TTFT + (tokens - 1) x TPOT."""
    out, stdout, _ = quick
    result = json.loads((out / "results.json").read_text())
    w = result["meta"]["workload"]
    prompts = w["batch1_prompts"]
    assert prompts == workloads.QUICK.batch1_prompts >= 1
    # The float32 reference is scored only (quality), never measured for speed.
    served = [
        c["name"] for c in result["configurations"] if c["servers"] and c["kind"] != "reference"
    ]
    runs = {r["config"]: r for r in result["batch1"]}
    assert sorted(runs) == sorted(served) and "gateway" not in runs
    summary = {s["config"]: s for s in result["summary"]}
    table = (out / "table.md").read_text()
    for name, r in runs.items():
        assert f"] {name}: batch 1, {prompts} prompts one at a time:" in stdout
        assert (r["concurrency"], r["clients"], r["completed"], r["failed"]) == (1, 1, prompts, 0)
        assert r["output_tokens"] == prompts * w["output_len"]
        assert r["median_ttft_ms"] > 0 and r["median_tpot_ms"] > 0 and r["output_tok_s"] > 0
        busy_s = prompts * (r["mean_ttft_ms"] + (w["output_len"] - 1) * r["mean_tpot_ms"]) / 1000
        assert busy_s <= r["window_s"] * 1.01 + 0.01, (name, busy_s, r)
        s = summary[name]
        got = (s["batch1_ttft_ms"], s["batch1_tpot_ms"], s["batch1_output_tok_s"])
        # One run: the summary's medians are its figures, rounded as the summary rounds.
        assert got == (r["median_ttft_ms"], r["median_tpot_ms"], round(r["output_tok_s"], 1))
        assert f"| {name} | {s['batch1_ttft_ms']:g} | {s['batch1_tpot_ms']:g} |" in table
        assert len(list((out / "raw").glob(f"{name}-batch1-client0.json"))) == 1
    assert summary["gateway"]["batch1_tpot_ms"] is None


def test_the_roofline_divides_by_measured_bandwidth(quick):
    """Without a calibration file the bench measures the bandwidth itself; the 0.2 M
    test model's weights fit in the L3 caches, so it has no roofline rows, and says why."""
    out, stdout, _ = quick
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["core_bandwidth_gbs"] > 0.5 and meta["core_alone_gbs"] > 0.5
    assert meta["node_cores"] >= 1
    if not Path("/etc/zenvllm/calibration.json").exists():
        # Read only too, the figure a decode step is measured against.
        assert meta["core_read_gbs"] > 0.5 and meta["core_read_alone_gbs"] > 0.5
        assert meta["bandwidth_measured_by_bench"] is True
        assert meta["bandwidth_source"].startswith("measured by the bench")
        assert "note: roofline bandwidth: measured by the bench" in stdout
    result = json.loads((out / "results.json").read_text())
    if meta["l3_bytes"] >= meta["weight_bytes"]:
        assert result["roofline"] == []
        assert "Roofline: none; the model's" in stdout
    assert "over 100%" not in stdout


def test_outputs_are_complete_and_consistent(quick):
    out, _, _ = quick
    assert check.check_outputs(out, list(catalogue.QUICK_CONFIGS)) == []


def test_every_configuration_ran_the_same_workload(quick):
    out, _, _ = quick
    result = json.loads((out / "results.json").read_text())
    w = result["meta"]["workload"]
    assert w == asdict(workloads.QUICK)
    names = {c["name"] for c in result["configurations"]}
    folded = {n for c in result["configurations"] for n in c["same_as"]}
    assert set(catalogue.QUICK_CONFIGS) <= names | folded
    for run in result["runs"]:
        assert run["completed"] == w["num_prompts"] and run["failed"] == 0
        assert run["output_tokens"] == w["num_prompts"] * w["output_len"]
    # One vLLM result file per client and repeat, warm-up kept apart.
    raw = out / "raw"
    for c in result["configurations"]:
        if c["kind"] == "reference":  # scored only: no clients of its own
            assert not list(raw.glob(f"{c['name']}-*-client*.json")), c["name"]
            continue
        clients = max(1, len(c["servers"]))
        assert len(list(raw.glob(f"{c['name']}-r1-client*.json"))) == clients
        assert len(list(raw.glob(f"{c['name']}-warmup-client*.json"))) == clients


def test_ratios_are_the_quotients_of_the_numbers_in_the_same_file(quick):
    out, _, _ = quick
    with (out / "summary.csv").open() as f:
        rows = {r["config"]: r for r in csv.DictReader(f)}
    stock = float(rows["stock"]["output_tok_s"])
    for row in rows.values():
        assert float(row["ratio"]) == pytest.approx(float(row["output_tok_s"]) / stock, abs=5e-4)
    table = (out / "table.md").read_text()
    for name, row in rows.items():
        assert f"{float(row['ratio']):.3f}x" in table, name


def test_csv_and_json_agree(quick):
    out, _, _ = quick
    result = json.loads((out / "results.json").read_text())
    with (out / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    runs = [*result["runs"], *result["batch1"]]  # the repeats, then batch 1
    assert len(rows) == len(runs)
    for row, run in zip(rows, runs, strict=True):
        assert row["config"] == run["config"]
        assert float(row["output_tok_s"]) == run["output_tok_s"]
        assert float(row["median_ttft_ms"]) == run["median_ttft_ms"]


def test_plots_are_png_images(quick):
    out, _, _ = quick
    for name in ("throughput.png", "latency.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        width, height = check.png_size(out / name)
        assert width >= 300 and height >= 200


def test_nothing_is_left_behind(quick, nginx_before):
    out, _, before = quick
    # nginx as the run found it: stopped again if its deploy started it.
    assert gateway.nginx_master() == nginx_before
    run_id = json.loads((out / "results.json").read_text())["meta"]["run_id"]
    assert bench_containers(run_id) == []
    label = f"label=zenvllm.deployment={gateway.DEPLOYMENT_PREFIX}{BASE_PORT + 90}"
    assert engine("ps", "-a", "-q", "--filter", label).stdout.split() == []
    assert not Path(f"/etc/nginx/conf.d/zenvllm-bench-{BASE_PORT + 90}.conf").exists()
    assert not list(out.parent.glob(".out.*"))  # the staging dir was renamed into place
    assert not [p for p in leftovers() - before if p.name.startswith("vllm_dist_")]


def test_interrupted_run_cleans_up_and_writes_nothing(prerequisites, tmp_path):
    """SIGTERM while the first server starts (the float32 reference's, on stock's port):
    containers removed, no output directory."""
    out = tmp_path / "out"
    port = BASE_PORT + 50
    argv = [*ZENVLLM, "bench", "--quick", "--configs", "stock", "--base-port", str(port)]
    server = f"zenvllm-bench-reference-{port}"
    proc = subprocess.Popen(
        [*argv, "--model", str(prerequisites), "--out", str(out)],
        env=engine_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not named(server):
            time.sleep(0.5)
        assert named(server), "the reference server never started"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert named(server) == [] and named(f"zenvllm-bench-stock-{port}") == []
    assert not out.exists()
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_a_full_disk_under_out_is_named_and_leaves_nothing(prerequisites, tmp_path):
    """--out on a 16 KiB filesystem: the results cannot be written; the run says so before
    it measures anything, exit 2, and leaves no output, no staging directory and no
    container. A disk that fills during a run is named by the CLI's one path for it
    (console.os_error: tests/unit/test_interruptions.py's render onto a full disk)."""
    require(os.geteuid() == 0, "mounting a small tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(small)], check=True)
    port = BASE_PORT + 60
    try:
        done = zenvllm_bench(
            *(
                "--quick",
                "--configs",
                "stock",
                "--base-port",
                str(port),
                "--no-plots",
                "--no-quality",
            ),
            *("--model", str(prerequisites), "--out", str(small / "out")),
            capture_output=True,
        )
        assert done.returncode == 2, done.stderr[-3000:]
        assert "--out's filesystem has " in done.stderr, done.stderr[-3000:]
        assert "under the 8 MiB the bench asks for its outputs" in done.stderr
        assert "free space there or choose another path" in done.stderr
        assert "Traceback" not in done.stderr
        assert list(small.iterdir()) == []
        assert named(f"zenvllm-bench-stock-{port}") == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_dry_run_prints_only_the_configurations_as_json(prerequisites, tmp_path):
    args = ["--model", str(prerequisites), "--configs", "stock,auto,vllm-dp"]
    done = zenvllm_bench(*args, "--dry-run", "--out", str(tmp_path / "out"), capture_output=True)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)  # notes go inside the JSON, not before it
    by_name = {c["name"]: c for c in plan["configurations"]}
    # Those asked for, after the float32 reference every other's quality is judged by.
    assert next(iter(by_name)) == "reference-f32"
    assert set(by_name) == {"reference-f32", "stock", "auto", "vllm-dp"}
    assert by_name["vllm-dp"]["servers"][0]["serve_args"][0] == "--data-parallel-size"
    assert any(n.startswith("planner bandwidth:") for n in plan["notes"])
    assert not (tmp_path / "out").exists()  # nothing measured, nothing written
