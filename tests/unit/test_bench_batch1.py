"""Issue 30: batch 1 beside the throughput workload, the roofline against measured
bandwidth (never over 100%), and a checker that derives every verdict again."""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from zenvllm.bench import (
    bandwidth,
    check,
    commands_bench,
    document,
    flags,
    generation,
    layouts,
    metrics,
    recompute,
    report,
    results,
    roofline,
    workloads,
)
from zenvllm.core.calibration import Calibration, NodeFigure
from zenvllm.core.errors import UserError
from zenvllm.core.host import MIB
from zenvllm.core.model import Model
from zenvllm.core.topology import read_host
from zenvllm.runtime import calibrate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "bench"
TINY = Model(name="tiny-llama", weight_bytes=2 * MIB, kv_bytes_per_token=1024, max_model_len=512)
HOST = read_host(FIXTURES / "test-machine-zen4-2cpu")  # one node, two cores, no SMT
WORKLOAD = replace(workloads.FULL, num_prompts=4, concurrency=4, repeats=2, output_len=8)
# 1 GB per decode step; every core busy 10 GB/s each, one core alone 12, a 2-core node.
META = {
    "model": "m",
    "host": "h",
    "cpus": 2,
    "workload": asdict(WORKLOAD),
    "load_before": [0.1, 0.1, 0.1],
    "load_after": [0.2, 0.2, 0.2],
    "wall_s": 60.0,
    "notes": [],
    "failures": [],
    "weight_bytes": 10**9,
    "host_cores": 2,
    **roofline.Bandwidth(10.0, 12.0, 2, "test figures", l3_bytes=32 * MIB).meta(),
}


def configs():
    found, _ = layouts.resolve(["stock", "auto", "two-per-node"], HOST, TINY, 8401, 512)
    return found


def client(prompts: int, tokens: int, rate: float, ttft: float, tpot: float):
    """A `vllm bench serve` result: `prompts` requests of `tokens` tokens at `rate` tok/s."""
    out = prompts * tokens
    return results.ClientResult(prompts, 0, out, out, out / rate, ttft, ttft, tpot, tpot, 100.0)


# (config, throughput tok/s, TPOT ms at concurrency 4, batch-1 tok/s, batch-1 TPOT ms)
FIGURES = (
    ("stock", 100.0, 120.0, 9.0, 100.0),
    ("auto", 180.0, 80.0, 15.0, 60.0),
    ("two-per-node", 120.0, 150.0, 9.5, 100.0),
)


def honest(workload=WORKLOAD, meta=META, figures=FIGURES) -> dict:
    w, runs, one = workload, [], []
    for name, rate, tpot, rate1, tpot1 in figures:
        clients = 2 if name == "two-per-node" else 1
        for repeat in range(1, w.repeats + 1):
            done = [
                client(s.num_prompts, w.output_len, rate / clients, 50.0, tpot)
                for s in w.shares(clients)
            ]
            runs.append(results.combine(name, repeat, done, 0.1, 1000, w.concurrency))
        if w.batch1_prompts:
            b = w.batch1()
            done = [client(b.num_prompts, b.output_len, rate1, 20.0, tpot1)]
            one.append(results.combine(name, 1, done, 0.1, concurrency=1))
    return document.result_document(meta, configs(), {"vllm-openai": "img:1"}, runs, one)


def written(tmp_path: Path, doc: dict) -> Path:
    report.write_outputs(doc, tmp_path, plots=False)
    for png in ("throughput.png", "latency.png"):  # the checker reads their headers only
        (tmp_path / png).write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(4) + b"IHDR" + bytes(8))
        with (tmp_path / png).open("r+b") as f:
            f.seek(16)
            f.write((400).to_bytes(4, "big") + (300).to_bytes(4, "big"))
    return tmp_path


def problems_after(tmp_path: Path, doc: dict, mutate) -> list[str]:
    """Tamper with a copy of the stored document only (the CSVs and table stay)."""
    broken = json.loads(json.dumps(doc))
    mutate(broken)
    (tmp_path / "results.json").write_text(json.dumps(broken))
    return check.check_outputs(tmp_path)


# -- batch 1 -----------------------------------------------------------------


def test_batch1_is_one_request_at_a_time_with_its_own_prompts():
    b = WORKLOAD.batch1()
    assert (b.num_prompts, b.concurrency, b.warmup_prompts) == (3, 1, 0)
    assert (b.input_len, b.output_len) == (WORKLOAD.input_len, WORKLOAD.output_len)
    seeds = {WORKLOAD.repeat(n).seed + i for n in range(WORKLOAD.repeats + 1) for i in range(4)}
    assert b.seed not in seeds  # never a warm-up's or a repeat's prompts
    assert workloads.FULL.batch1_prompts == workloads.QUICK.batch1_prompts == 3
    with pytest.raises(UserError, match="--batch1-prompts -1"):
        replace(WORKLOAD, batch1_prompts=-1).check(512)


def test_the_option_sets_the_prompts_and_zero_turns_batch1_off():
    parser = argparse.ArgumentParser()
    commands_bench.register(parser.add_subparsers())

    def workload(*argv: str) -> workloads.Workload:
        request = flags.request_of(vars(parser.parse_args(["bench", *argv])))
        return generation.workload_from(request.quick, request.workload_overrides())

    assert workload("--model", "/m", "--quick", "--batch1-prompts", "0").batch1_prompts == 0
    assert workload("--model", "/m").batch1_prompts == workloads.FULL.batch1_prompts
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--model", "/m", "--batch1-prompts", "-2"])


def test_batch1_figures_are_in_the_summary_the_csvs_and_the_tables(tmp_path):
    doc = honest()
    rows = {s["config"]: s for s in doc["summary"]}
    assert rows["auto"]["batch1_tpot_ms"] == 60.0 and rows["auto"]["batch1_ttft_ms"] == 20.0
    assert rows["auto"]["batch1_output_tok_s"] == 15.0
    assert [r["concurrency"] for r in doc["batch1"]] == [1, 1, 1]
    assert {r["concurrency"] for r in doc["runs"]} == {WORKLOAD.concurrency}
    written(tmp_path, doc)
    with (tmp_path / "runs.csv").open() as f:
        concurrency = [int(r["concurrency"]) for r in csv.DictReader(f)]
    assert concurrency == [4] * 6 + [1] * 3  # the repeats, then batch 1
    with (tmp_path / "summary.csv").open() as f:
        assert [r["batch1_tpot_ms"] for r in csv.DictReader(f)] == ["100.0", "60.0", "100.0"]
    table = (tmp_path / "table.md").read_text()
    assert "| auto | 20 | 60 | 15 | 80 |" in table  # TTFT, TPOT, tok/s; TPOT at 4 beside
    assert check.check_outputs(tmp_path) == []


def test_without_batch1_there_are_no_batch1_figures(tmp_path):
    w = replace(WORKLOAD, batch1_prompts=0)
    doc = honest(w, {**META, "workload": asdict(w)})
    assert doc["batch1"] == [] and doc["summary"][0]["batch1_tpot_ms"] is None
    assert "planner_batch1_percent" not in doc["verdict"]
    assert "batch 1" not in roofline.roofline_table(doc["roofline"], META)
    assert check.check_outputs(written(tmp_path, doc)) == []


def test_a_missing_or_short_batch1_run_is_a_problem(tmp_path):
    doc = honest()
    written(tmp_path, doc)
    found = problems_after(tmp_path, doc, lambda d: d["batch1"].pop())
    assert "two-per-node: no batch-1 run" in found
    found = problems_after(tmp_path, doc, lambda d: d["batch1"][0].update(completed=2))
    assert "stock batch 1: 2 completed, 0 failed of 3" in found


# -- the roofline --------------------------------------------------------------


def test_batch1_bandwidth_is_the_cores_alone_capped_by_their_node():
    # One core of a 2-core node, the other idle: what one core streams alone.
    assert roofline.batch1_bandwidth(1, busy=10.0, alone=12.0, node_cores=2) == 12.0
    # The whole node: what it streams with every core busy, the throughput figure.
    assert roofline.batch1_bandwidth(2, busy=10.0, alone=12.0, node_cores=2) == 20.0
    # 8 of 96 cores: each at most alone; an instance over two whole nodes: their share.
    assert roofline.batch1_bandwidth(8, busy=4.0, alone=30.0, node_cores=96) == 240.0
    assert roofline.batch1_bandwidth(192, busy=4.0, alone=30.0, node_cores=96) == 768.0
    # A noisy alone figure under the busy one never lowers the bound below it.
    assert roofline.batch1_bandwidth(1, busy=10.0, alone=8.0, node_cores=2) == 10.0


def test_the_roofline_has_batch1_columns_against_the_first_instance():
    rows = {r["config"]: r for r in honest()["roofline"]}
    # auto: one 2-core instance; 1 GB / 80 ms = 12.5 GB/s of 2 x 10 at concurrency 4,
    # 1 GB / 60 ms = 16.67 GB/s of min(2 x 12, 2 x 10) = 20 at batch 1.
    assert rows["auto"] == {
        "config": "auto",
        "weight_gbs": 12.5,
        "bandwidth_gbs": 20.0,
        "percent": 62.5,
        "batch1_weight_gbs": 16.67,
        "batch1_bandwidth_gbs": 20.0,
        "batch1_percent": 83.3,
    }
    # two-per-node at batch 1: one 1-core instance works, the other core idles: 12.
    assert rows["two-per-node"]["batch1_bandwidth_gbs"] == 12.0
    assert rows["two-per-node"]["batch1_percent"] == round(100 * 10 / 12, 1)
    v = honest()["verdict"]
    assert v["planner_batch1_percent"] == 83.3 and v["planner_batch1_goal_met"] is True
    table = roofline.roofline_table(list(rows.values()), META)
    assert "| auto | 12.5 | 20 | 62.5% | 16.67 | 20 | 83.3% |" in table
    assert "one-core-alone figure (12 GB/s)" in table


def test_a_share_over_100_percent_is_never_printed_and_fails_the_check(tmp_path):
    # The bandwidth figure is too low: 4 GB/s per core (the planner's default) here.
    meta = {**META, **roofline.Bandwidth(4.0, 4.0, 2, "a default", l3_bytes=0).meta()}
    doc = honest(meta=meta)
    rows = {r["config"]: r for r in doc["roofline"]}
    assert rows["auto"]["percent"] == 156.2  # 12.5 GB/s over 8
    assert doc["verdict"]["planner_batch1_goal_met"] is None  # unknown, not met
    written(tmp_path, doc)
    table = (tmp_path / "table.md").read_text()
    assert "156.2%" not in table and "208.3%" not in table
    assert f"| auto | 12.5 | 8 | {roofline.OVER} |" in table
    assert (
        "Planner at batch 1: more weight bytes than its instance's bandwidth figure allows "
        f"({roofline.OVER}) (goal 60%: unknown)."
    ) in table
    found = check.check_outputs(tmp_path)
    assert any(p.startswith("roofline: auto at batch 1 streamed 16.67 GB/s") for p in found)
    assert any("(156.2%): the bandwidth figure is too low (a default)" in p for p in found)


def test_the_roofline_reads_against_the_read_only_figure_where_it_was_measured(tmp_path):
    """A decode step only reads: against a copy's figure (read + written, 4 GB/s per core
    here) auto's batch 1 is impossible, against the read-only one (10 and 12, measured
    beside it) it is a share; a run without read figures keeps the copy's."""
    copy = roofline.Bandwidth(4.0, 4.0, 2, "copy", l3_bytes=0)
    meta = {**META, **replace(copy, read_busy_gbs=10.0, read_alone_gbs=12.0).meta()}
    doc = honest(meta=meta)
    rows = {r["config"]: r for r in doc["roofline"]}
    assert (rows["auto"]["percent"], rows["auto"]["batch1_percent"]) == (62.5, 83.3)
    assert doc["verdict"]["planner_batch1_goal_met"] is True
    written(tmp_path, doc)
    table = (tmp_path / "table.md").read_text()
    assert "x 10 GB/s per core with every core busy, read only (copy)" in table
    assert "one-core-alone figure (12 GB/s)" in table and roofline.OVER not in table
    assert check.check_outputs(tmp_path) == []
    copy_only = {r["config"]: r for r in honest(meta={**META, **copy.meta()})["roofline"]}
    assert copy_only["auto"]["percent"] == 156.2  # the copy's figure, as before


def test_weights_that_fit_in_the_l3_caches_have_no_roofline(tmp_path):
    meta = {**META, "weight_bytes": 8 * MIB}  # the 32 MiB of L3 hold them
    doc = honest(meta=meta)
    assert doc["roofline"] == [] and "planner_batch1_percent" not in doc["verdict"]
    written(tmp_path, doc)
    assert "fit in the host's L3 caches (33.6 MB)" in (tmp_path / "table.md").read_text()
    assert check.check_outputs(tmp_path) == []


# -- the check derives every verdict again ---------------------------------------


def test_an_honest_document_passes(tmp_path):
    doc = honest()
    assert check.check_outputs(written(tmp_path, doc), ["stock", "auto", "two-per-node"]) == []
    assert check.main([str(tmp_path), "--acceptance", "--near-best"]) == 0


@pytest.mark.parametrize(
    ("mutate", "says"),
    [
        (lambda d: d["verdict"].update(meets_acceptance=False), "verdict: meets_acceptance is"),
        (lambda d: d["verdict"].update(planner_ratio=2.5), "verdict: planner_ratio is 2.5"),
        (lambda d: d["verdict"].update(best_layout="two-per-node"), "verdict: best_layout"),
        (lambda d: d["verdict"].update(best_overall="stock"), "verdict: best_overall"),
        (lambda d: d["verdict"].update(near_best=False), "verdict: near_best is False"),
        (lambda d: d["verdict"].update(planner_vs_best=0.9), "verdict: planner_vs_best"),
        (lambda d: d["verdict"].pop("near_best"), "verdict: near_best is missing"),
        (lambda d: d["verdict"].update(planner_batch1_goal_met=False), "planner_batch1_goal"),
        (lambda d: d["roofline"][1].update(batch1_percent=61.0), "roofline: auto batch1_percent"),
        (lambda d: d["roofline"][1].update(percent=99.0), "roofline: auto percent is 99.0"),
        (lambda d: d["summary"][1].update(batch1_tpot_ms=50.0), "summary: auto batch1_tpot_ms"),
        (lambda d: d["summary"][1].update(tpot_ms=70.0), "summary: auto tpot_ms is 70.0"),
        (lambda d: d["peers"][0].update(tpot=0.5), "peers: stock tpot 0.5 is not"),
    ],
)
def test_a_tampered_stored_figure_fails_the_check(tmp_path, mutate, says):
    doc = honest()
    written(tmp_path, doc)
    found = problems_after(tmp_path, doc, mutate)
    assert any(says in p for p in found), found


def test_a_tampered_verdict_cannot_pass_acceptance(tmp_path):
    """Runs that miss the 1.3x acceptance, a verdict and table that claim it: the check
    fails, and --acceptance goes by the runs."""
    slow = (("stock", 150.0, 120.0, 9.0, 100.0), *FIGURES[1:])  # auto 1.2x stock
    doc = honest(figures=slow)
    assert doc["verdict"]["meets_acceptance"] is False
    doc["verdict"]["meets_acceptance"] = True
    written(tmp_path, doc)  # the table says "met" too
    assert "verdict: meets_acceptance is True, the runs give False" in check.check_outputs(tmp_path)
    assert check.main([str(tmp_path), "--acceptance"]) == 1


@pytest.mark.parametrize(
    "name", ["", "qwen0.5b", "qwen1.5b", "qwen0.5b-quant", "qwen0.5b-quant-layouts"]
)
def test_the_recorded_runs_pass_with_every_verdict_derived_again(name):
    out = DOCS / name
    result = json.loads((out / "results.json").read_text())
    derived = document.derive(result)
    assert recompute.problems(result, derived) == []
    assert check.check_outputs(out) == []


# -- the bandwidth ---------------------------------------------------------------


def measured(host, seconds):
    return Calibration(
        cpu_model=host.cpu_name,
        cpus=len(host.allowed_cpus),
        measured_at="2026-11-25T00:00:00+00:00",
        method="test",
        core_alone_gbs=15.5,
        nodes={0: NodeFigure(2, 26.0, 40.0)},
        read_alone_gbs=24.0,
    )


def test_without_a_calibration_file_the_bench_measures_the_bandwidth(tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate, "DEFAULT_PATH", str(tmp_path / "none.json"))
    calls = []

    def measure_now(host, seconds):
        calls.append(seconds)
        return measured(host, seconds)

    policy, bw, notes = bandwidth.figures(HOST, TINY, measure_now=measure_now)
    assert calls == [bandwidth.SECONDS]
    assert policy.core_bandwidth_gbs == 4.0  # the planner keeps what a deployment gets
    assert (bw.core_busy_gbs, bw.core_alone_gbs, bw.node_cores) == (13.0, 15.5, 2)
    assert (bw.read_busy_gbs, bw.read_alone_gbs) == (20.0, 24.0)
    assert "20 and 24 GB/s reading" in bw.source
    assert bw.measured_by_bench and bw.source.startswith("measured by the bench")
    assert any(n.startswith("roofline bandwidth: measured by the bench") for n in notes)
    assert any(n.startswith("planner bandwidth: a spec-sheet default") for n in notes)
    # A dry run measures nothing and says so.
    _, bw, notes = bandwidth.figures(HOST, TINY, measure=False, measure_now=measure_now)
    assert bw is None and calls == [bandwidth.SECONDS]
    assert any("bandwidth not measured" in n for n in notes)


def test_a_calibration_file_of_this_host_is_used_and_one_of_another_is_not(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    monkeypatch.setattr(calibrate, "DEFAULT_PATH", str(path))

    def never(host, seconds):
        raise AssertionError("measured although a calibration file describes this host")

    path.write_text(measured(HOST, 0).to_json())
    policy, bw, _ = bandwidth.figures(HOST, TINY, measure_now=never)
    assert policy.core_bandwidth_gbs == bw.core_busy_gbs == 13.0
    assert (bw.read_busy_gbs, bw.read_alone_gbs) == (20.0, 24.0)
    assert not bw.measured_by_bench and str(path) in bw.source
    other = replace(measured(HOST, 0), cpu_model="another CPU")
    path.write_text(other.to_json())
    _, bw, notes = bandwidth.figures(HOST, TINY, measure_now=measured)
    assert bw.measured_by_bench and "describes another host" in bw.source
    assert any("ignored" in n for n in notes)


def test_the_bench_measures_its_own_figure_again_at_the_end_and_no_other():
    start = roofline.Bandwidth(26.0, 15.5, 2, "measured by the bench", measured_by_bench=True)
    assert bandwidth.at_end(start, measure_now=measured) == {"bandwidth_end_gbs": 13.0}
    reading = replace(start, read_busy_gbs=30.0, read_alone_gbs=24.0)
    assert bandwidth.at_end(reading, measure_now=measured) == {
        "bandwidth_end_gbs": 13.0,
        "bandwidth_read_end_gbs": 20.0,
    }
    meta = {**reading.meta(), "bandwidth_end_gbs": 13.0, "bandwidth_read_end_gbs": 20.0}
    assert roofline.end_note(meta) == (
        "; measured again at the run's end: copying 13 GB/s (-50%), reading 20 GB/s (-33%), "
        "beyond ±25%: the machine changed during the run, so this roofline and the "
        "predictions are uncertain by that much."
    )

    def never(host, seconds):
        raise AssertionError("measured again a figure the bench did not measure")

    assert bandwidth.at_end(replace(start, measured_by_bench=False), measure_now=never) == {}
    assert bandwidth.at_end(None, measure_now=never) == {}

    def fails(host, seconds):
        raise UserError("no usable CPUs to measure")

    assert bandwidth.at_end(start, measure_now=fails) == {}  # the start's figure stands


def test_the_runs_figure_is_the_higher_of_its_start_and_its_end():
    """Other work only lowers a measurement: a start measured low (CI's Zen 4: 12.55 GB/s
    per core busy, 19.51 at the end) gives way to the end's, the start's kept beside it;
    a start measured higher stands."""
    low = roofline.Bandwidth(12.55, 15.0, 2, "bench", True, read_busy_gbs=14.0, read_alone_gbs=20.0)
    ended = {"bandwidth_end_gbs": 19.51, "bandwidth_read_end_gbs": 22.0}
    figures = bandwidth.run_figures(low, ended)
    assert figures == {
        "bandwidth_start_gbs": 12.55,
        "core_bandwidth_gbs": 19.51,
        "bandwidth_read_start_gbs": 14.0,
        "core_read_gbs": 22.0,
    }
    meta = {**low.meta(), **ended, **figures}
    assert roofline.end_note(meta) == (
        "; measured again at the run's end: copying 19.51 GB/s (+55%), reading 22 GB/s "
        "(+57%); the run's figure is the higher of the two (other work only lowers one), "
        "beyond ±25%: the machine changed during the run, so this roofline and the "
        "predictions are uncertain by that much."
    )
    assert roofline.ceiling(meta)[0] == 22.0  # the roofline reads against the higher
    high = replace(low, core_busy_gbs=25.0, read_busy_gbs=30.0)
    assert bandwidth.run_figures(high, ended) == {}  # the start's stand
    assert bandwidth.run_figures(None, ended) == {}


def test_l3_bytes_counts_each_shared_cache_once(tmp_path):
    for cpu in (0, 1, 2):
        for index, level, size, shared in (
            (0, "1", "48K", str(cpu)),
            (3, "3", "32768K", "0-1" if cpu < 2 else "2"),
        ):
            d = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
            d.mkdir(parents=True)
            (d / "level").write_text(level + "\n")
            (d / "size").write_text(size + "\n")
            (d / "shared_cpu_list").write_text(shared + "\n")
    assert bandwidth.l3_bytes({0, 1, 2}, tmp_path) == 2 * 32 * MIB
    assert bandwidth.l3_bytes({0, 1}, tmp_path) == 32 * MIB
    assert bandwidth.l3_bytes({7}, tmp_path) == 0  # sysfs says nothing


def test_batch1_latencies_are_prometheus_gauges_too():
    text = metrics.exposition(
        {**honest(), "meta": {**META, "run_id": "r", "date": "2026-11-25T00:00:00Z"}}
    )
    assert 'zenvllm_bench_batch1_tpot_seconds{model="m",run_id="r",config="auto"} 0.06' in text
