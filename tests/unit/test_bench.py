"""The benchmark's pure parts: workload split, configurations, result folding, the files."""

from __future__ import annotations

import csv
import json
import re
import shutil
import signal
import statistics
import subprocess
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zenvllm.bench import (
    catalogue,
    check,
    document,
    generation,
    launch,
    layouts,
    report,
    results,
    roofline,
    servers,
    tables,
    workloads,
)
from zenvllm.core import speculation
from zenvllm.core.container import container_of
from zenvllm.core.errors import UserError
from zenvllm.core.host import MIB
from zenvllm.core.model import Model
from zenvllm.core.request import Request
from zenvllm.core.topology import read_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RESULT = FIXTURES / "bench" / "vllm-bench-serve-0.32.0.json"  # a real `vllm bench serve` file
TINY = Model(name="tiny-llama", weight_bytes=2 * MIB, kv_bytes_per_token=1024, max_model_len=512)


def host(name: str):
    return read_host(FIXTURES / "hosts" / name)


def client(tokens=512, duration=1.0, end=100.0, completed=16, ttft=20.0, tpot=4.0):
    return results.ClientResult(
        completed=completed,
        failed=0,
        input_tokens=tokens,
        output_tokens=tokens,
        duration_s=duration,
        mean_ttft_ms=ttft,
        median_ttft_ms=ttft,
        mean_tpot_ms=tpot,
        median_tpot_ms=tpot,
        finished_at=end,
    )


# -- workload ----------------------------------------------------------------


@given(
    prompts=st.integers(1, 500),
    conc=st.integers(1, 64),
    clients=st.integers(1, 16),
    warm=st.integers(0, 20),
)
def test_shares_add_up_to_the_workload(prompts, conc, clients, warm):
    w = replace(workloads.FULL, num_prompts=prompts, concurrency=conc, warmup_prompts=warm)
    if clients > min(prompts, conc):
        with pytest.raises(UserError, match=f"{clients} instances need"):
            w.shares(clients)
        return
    shares = w.shares(clients)
    assert sum(s.num_prompts for s in shares) == prompts
    assert sum(s.concurrency for s in shares) == conc
    assert sum(s.warmup_prompts for s in shares) == warm
    assert all(s.num_prompts >= 1 and s.concurrency >= 1 for s in shares)
    assert max(s.num_prompts for s in shares) - min(s.num_prompts for s in shares) <= 1
    assert len({s.seed for s in shares}) == clients  # each client sends its own prompts
    assert {(s.input_len, s.output_len) for s in shares} == {(w.input_len, w.output_len)}


def test_workload_check_names_the_limit():
    with pytest.raises(
        UserError, match=r"--input-len 400 \+ --output-len 128 exceeds --max-model-len 512"
    ):
        replace(workloads.FULL, input_len=400).check(512)
    with pytest.raises(UserError, match="--repeats 0"):
        replace(workloads.FULL, repeats=0).check(512)
    workloads.FULL.check(512)
    workloads.QUICK.check(512)


def test_full_workload_is_amds_shape_scaled():
    # AMD: 128 in / 128 out, 1024 prompts at batch 128, i.e. 8 waves.
    w = workloads.FULL
    assert (w.input_len, w.output_len) == (128, 128)
    assert w.num_prompts // w.concurrency == 1024 // 128
    assert w.repeats >= 3 and w.warmup_prompts > 0
    assert workloads.QUICK.repeats == 1 and workloads.QUICK.num_prompts < w.num_prompts


def test_client_args_ask_vllm_for_exactly_the_workload():
    share = replace(workloads.FULL, num_prompts=32, concurrency=4, seed=7)
    args = launch.client_args("http://127.0.0.1:8402", "/model", share, "/results", "a.json")
    opts = dict(zip(args[2::2], args[3::2], strict=False))
    assert args[:2] == ["bench", "serve"]
    assert "--ignore-eos" in args  # every request yields exactly output_len tokens
    assert "--save-result" in args
    assert args[args.index("--base-url") + 1] == "http://127.0.0.1:8402"
    for flag, value in (
        ("--random-input-len", "128"),
        ("--random-output-len", "128"),
        ("--num-prompts", "32"),
        ("--max-concurrency", "4"),
        ("--seed", "7"),
        ("--tokenizer", layouts.MODEL_MOUNT),
        ("--dataset-name", "random"),
        ("--result-filename", "a.json"),
    ):
        assert args[args.index(flag) + 1] == value, (flag, opts)


# -- configurations ----------------------------------------------------------


def test_parse_configs():
    assert layouts.parse_configs(None, quick=False) == list(catalogue.SPECS)
    assert layouts.parse_configs(None, quick=True) == list(catalogue.QUICK_CONFIGS)
    assert layouts.parse_configs("stock, auto,auto", quick=False) == ["stock", "auto"]
    with pytest.raises(UserError, match="unknown configuration 'fast'; choose from stock"):
        layouts.parse_configs("stock,fast", quick=False)
    with pytest.raises(UserError, match="include 'stock'"):
        layouts.parse_configs("auto", quick=False)


def test_two_core_machine_folds_identical_layouts():
    configs, notes = layouts.resolve(
        list(catalogue.SPECS), host("test-machine-zen4-2cpu"), TINY, 8401, 512
    )
    by_name = {c.name: c for c in configs}
    # One node of two cores without SMT: auto is one 2-core instance (never a 1-core one
    # there), the same run as single, per-node and interleaved; two-per-node stands apart.
    # This CPU computes bf16, the dtype stock serves: auto-stock-dtype is auto's run.
    assert by_name["auto"].same_as == ("single", "per-node", "auto-interleaved", "auto-stock-dtype")
    assert set(by_name) == {
        "stock",
        "auto",
        "auto-stock-bind",  # auto's containers, vLLM's default binding in them
        "auto-ngram",  # auto's cores, n-gram speculation
        "two-per-node",
        "zen-auto",
        "pace-auto",  # another image: never folded into auto
        "vllm-dp",
        "vllm-tp",  # one copy over two ranks, one per core, against the replicas
        "vllm-pp",
        "llamacpp",
        "llamacpp-q8",
        "gateway",
    }
    # Under 8 cores without SMT, OpenMP gets every core of the slice (vLLM's auto keeps one).
    assert [(s.cpus, s.omp_bind) for s in by_name["auto"].servers] == [("0-1", "0-1")]
    assert by_name["auto"].shape == "1 x 2 CPUs"
    unbound = by_name["auto-stock-bind"]
    assert [(s.cpus, s.omp_bind) for s in unbound.servers] == [("0-1", "auto")]
    assert unbound.servers[0].env["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    assert unbound.serve_env == (("VLLM_CPU_OMP_THREADS_BIND", "auto"),)
    assert any("single: identical to auto" in n for n in notes)
    assert [(s.cpus, s.omp_bind) for s in by_name["two-per-node"].servers] == [
        ("0", "0"),
        ("1", "1"),
    ]
    # zen differs from plain by image and env, so it is never folded into it.
    assert by_name["zen-auto"].target == "zen"
    assert by_name["zen-auto"].same_as == ("zen-single",)
    assert by_name["zen-auto"].shape == "1 x 2 CPUs"
    assert by_name["zen-auto"].servers[0].env["VLLM_ZENTORCH_WEIGHT_PREPACK"] == "1"
    assert by_name["gateway"].servers == ()


def test_big_hosts_keep_per_node_and_interleaved_apart():
    eight_gib = Model(
        name="8g", weight_bytes=8 << 30, kv_bytes_per_token=131072, max_model_len=4096
    )
    configs, _ = layouts.resolve(
        list(catalogue.SPECS), host("epyc-9654-nps4"), eight_gib, 8401, 512
    )
    by_name = {c.name: c for c in configs}
    # 24-core nodes are smaller than the 43 cores 8 GiB wants: auto is one per node.
    assert "per-node" in by_name["auto"].same_as and len(by_name["auto"].servers) == 4
    assert len(by_name["single"].servers) == 1
    # 128 cores, one node: auto cuts 43-core slices; contiguous and interleaved differ.
    configs, _ = layouts.resolve(
        list(catalogue.SPECS), host("epyc-9755-1s-nps1"), eight_gib, 8401, 512
    )
    by_name = {c.name: c for c in configs}
    assert by_name["single"].same_as == ("per-node",)
    contiguous = [s.cpus for s in by_name["auto"].servers]
    interleaved = [s.cpus for s in by_name["auto-interleaved"].servers]
    assert len(contiguous) == len(interleaved) > 1
    assert contiguous != interleaved


def test_zen_is_skipped_with_a_reason_where_the_cpu_cannot_run_it():
    configs, notes = layouts.resolve(
        list(catalogue.SPECS), host("vm-milan-8vcpu-avx2"), TINY, 8401, 512
    )
    assert not any(c.target == "zen" for c in configs)
    assert any(n.startswith("zen-auto: skipped") and "avx512" in n for n in notes)


def bench_settings(eager: bool = False) -> Request:
    return launch.container_settings("img:1", Path("/m"), 512, eager, Path("/run/b"))


def test_stock_is_what_vllms_docs_give():
    (stock, *_), _ = layouts.resolve(["stock"], host("test-machine-zen4-2cpu"), TINY, 8401, 512)
    spec = launch.server_launch(stock.servers[0], bench_settings(), "r1")
    argv = spec.argv
    assert spec.files == {}
    assert "VLLM_CPU_OMP_THREADS_BIND=auto" in argv
    assert f"VLLM_CPU_KVCACHE_SPACE={catalogue.STOCK_KV_GIB}" in argv
    assert not any(a.startswith(("--cpuset", "--memory")) for a in argv)
    assert "--shm-size=4g" in argv
    assert not any(a.startswith("LD_PRELOAD") for a in argv)  # the image's own preload stays
    # vllm itself, not the zenvllm launcher, so no planner touches the stock run.
    assert argv[argv.index("--entrypoint") + 1] == "vllm"
    assert argv[argv.index("img:1") + 1 :][:2] == ["serve", layouts.MODEL_MOUNT]
    assert "--enforce-eager" not in argv
    assert f"{launch.BENCH_LABEL}=r1" in argv
    assert argv[argv.index("--dtype") + 1] == "bfloat16"  # as a user runs a bf16 model


@pytest.mark.parametrize(
    ("fixture", "asked", "stock", "plan"),
    [
        ("vm-milan-8vcpu-avx2", "bfloat16", "bfloat16", "float32"),  # bf16 emulated
        ("vm-milan-8vcpu-avx2", "plan", "float32", "float32"),  # the speed guard's runs
        ("test-machine-zen4-2cpu", "plan", "bfloat16", "bfloat16"),
    ],
)
def test_stock_dtype_plan_gives_stock_the_planners_dtype(fixture, asked, stock, plan):
    on = host(fixture)
    assert generation.dtypes(asked, on) == (stock, plan)
    (config, *_), _ = layouts.resolve(["stock"], on, TINY, 8401, 512, stock_dtype=stock)
    argv = launch.server_launch(config.servers[0], bench_settings(), "r1").argv
    assert argv[argv.index("--dtype") + 1] == stock


def test_the_plan_in_stocks_dtype_stands_apart_where_the_cpu_emulates_bf16():
    """On an AVX2-only host the planner serves float32; auto-stock-dtype is its layout in
    stock's bf16, the speed guard's sabotaged plan there (bench/guard.py: sabotaged)."""
    names = ["stock", "auto", "auto-stock-dtype"]
    configs, _ = layouts.resolve(names, host("vm-milan-8vcpu-avx2"), TINY, 8401, 512)
    auto, in_bf16 = configs[1], configs[2]
    assert [c.name for c in configs] == names and not auto.same_as
    assert {s.instance.dtype for s in auto.servers} == {"float32"}
    assert {s.instance.dtype for s in in_bf16.servers} == {"bfloat16"}
    argv = launch.server_launch(in_bf16.servers[0], bench_settings(), "r1").argv
    assert "--dtype=bfloat16" in " ".join(argv)


def test_the_plan_with_ngram_speculation_stands_apart_and_runs_its_flag():
    """auto-ngram is the planner's layout with `speculation: ngram`: the same cores, so
    only the speculation keeps it from folding into auto; its containers serve the flag
    core/speculation.py gives a plan, auto's do not, and a --weights copy is not
    measured with it."""
    on = host("test-machine-zen4-2cpu")
    copy = layouts.Weights("w8a8", "/srv/w8a8", TINY)
    configs, _ = layouts.resolve(["auto", "auto-ngram"], on, TINY, 8401, 512, copies=(copy,))
    assert [c.name for c in configs] == ["auto", "auto-ngram", "auto-w8a8"]
    auto, ngram = configs[0], configs[1]
    assert [s.cpus for s in ngram.servers] == [s.cpus for s in auto.servers]
    flag = speculation.decide("ngram", "generate", split=False).serve_args()
    assert flag and flag[0].startswith("--speculative-config=")
    for config, served in ((auto, False), (ngram, True)):
        argv = launch.server_launch(config.servers[0], bench_settings(), "r1").argv
        assert (flag[0] in argv) is served, argv


def test_planned_servers_run_the_deployments_container():
    configs, _ = layouts.resolve(["stock", "auto"], host("vm-milan-8vcpu-avx2"), TINY, 8401, 512)
    second = configs[1].servers[1]
    settings = bench_settings(eager=True)
    spec = launch.server_launch(second, settings, "r1")
    container = container_of(second.instance, settings)
    # The container contract's own argv, plus only the run's label.
    assert spec.argv == [
        "run",
        "--label",
        f"{launch.BENCH_LABEL}=r1",
        *container.run_args[1:],
    ]
    argv = spec.argv
    # 31 GiB hold six instances of 4.6 GiB: two 2-core slices, then four of one core.
    assert "--cpuset-cpus=2-3" in argv and "--cpuset-mems=0" in argv
    assert "--network=host" in argv and "--cap-drop=ALL" in argv
    assert f"--security-opt=seccomp={launch.SECCOMP_PROFILE}" in argv
    assert launch.SECCOMP_PROFILE.is_file()
    assert "--entrypoint" not in argv  # the image's launcher validates the plan
    assert "--port=8402" in argv and "--enforce-eager" in argv
    assert argv[:4] == ["run", "--label", f"{launch.BENCH_LABEL}=r1", "--detach"]
    assert "--restart=no" in argv and "--rm" not in argv  # the bench reads its log first
    env_file = f"/run/b/{second.name}.env"
    assert f"--env-file={env_file}" in argv
    env = dict(line.split("=", 1) for line in spec.files[env_file].splitlines())
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2-3" and env["HF_HUB_OFFLINE"] == "1"
    assert json.loads(env["ZENVLLM_PLAN"])["cpus"] == "2-3"
    assert argv[-1] == "--enforce-eager"


# -- results -----------------------------------------------------------------


def test_parse_a_real_result_file():
    data = json.loads(RESULT.read_text())
    r = results.parse_client_result(data, "x.json", 5.0)
    assert (r.completed, r.failed, r.output_tokens) == (16, 0, 512)
    assert r.duration_s == pytest.approx(0.6445, abs=1e-4)
    assert r.output_tokens / r.duration_s == pytest.approx(data["output_throughput"])


def test_parse_rejects_what_is_not_a_result():
    data = json.loads(RESULT.read_text())
    del data["median_tpot_ms"], data["duration"]
    with pytest.raises(
        ValueError,
        match=r"x\.json: not a `vllm bench serve` result, missing duration, median_tpot_ms",
    ):
        results.parse_client_result(data, "x.json", 0)
    data = json.loads(RESULT.read_text()) | {"completed": 0}
    with pytest.raises(ValueError, match="no request completed"):
        results.parse_client_result(data, "x.json", 0)


def test_one_client_run_is_vllms_own_number():
    run = results.combine("stock", 1, [client(tokens=1000, duration=2.0)], 0.5)
    assert run.output_tok_s == 500.0 and run.window_s == 2.0 and run.clients == 1


def test_clients_are_summed_over_their_common_span():
    aligned = results.combine("auto", 1, [client(512, 1.0, 10.0), client(512, 1.0, 10.0)], 0)
    assert aligned.output_tok_s == 1024.0
    # A client that starts half a second late stretches the span: skew counts against.
    skewed = results.combine("auto", 1, [client(512, 1.0, 10.0), client(512, 1.0, 10.5)], 0)
    assert skewed.window_s == 1.5 and skewed.output_tok_s == round(1024 / 1.5, 2)
    mixed = results.combine(
        "auto", 1, [client(completed=1, ttft=10), client(completed=3, ttft=30)], 0
    )
    assert mixed.median_ttft_ms == 25.0  # request-weighted


def runs_of(config, rates):
    return [
        results.combine(config, i + 1, [client(tokens=int(rate * 10), duration=10.0)], 0.1)
        for i, rate in enumerate(rates)
    ]


def sample_configs():
    # Eight CPUs without SMT: single (1 x 8) and auto (four of 2 CPUs) are distinct runs.
    configs, _ = layouts.resolve(
        ["stock", "single", "auto"], host("vm-milan-8vcpu-avx2"), TINY, 8401, 512
    )
    return configs


def test_summary_is_median_and_spread_and_ratio_to_stock():
    configs = sample_configs()
    runs = (
        runs_of("stock", [400, 420, 380])
        + runs_of("single", [300, 310, 290])
        + runs_of("auto", [700, 560, 600])
    )
    summaries = {s.config: s for s in results.summarize(runs, configs)}
    assert (
        summaries["auto"].output_tok_s,
        summaries["auto"].output_min,
        summaries["auto"].output_max,
    ) == (
        600.0,
        560.0,
        700.0,
    )
    assert summaries["stock"].ratio == 1.0
    assert summaries["auto"].ratio == 1.5
    assert summaries["single"].ratio == 0.75
    v = document.verdict(list(summaries.values()), configs)
    assert v["meets_acceptance"] and v["planner_is_best_layout"] and v["best_layout"] == "auto"


def test_verdict_says_when_the_planner_is_not_best():
    configs = sample_configs()
    runs = runs_of("stock", [400]) + runs_of("single", [500]) + runs_of("auto", [480])
    v = document.verdict(results.summarize(runs, configs), configs)
    assert not v["meets_acceptance"] and not v["planner_is_best_layout"]
    assert v["best_layout"] == "single" and v["planner_ratio"] == 1.2


def result_doc(configs, runs):
    meta = {
        "model": "tiny-llama",
        "host": "test host",
        "cpus": 2,
        "workload": {
            **asdict(
                replace(workloads.FULL, repeats=3, num_prompts=1, output_len=1, batch1_prompts=0)
            )
        },
        "load_before": [0.1, 0.1, 0.1],
        "load_after": [0.2, 0.2, 0.2],
        "wall_s": 60.0,
        "notes": ["per-node: identical to single"],
        "failures": [],
    }
    return document.result_document(meta, configs, {"vllm-openai": "img:1"}, runs)


def consistent_runs():
    runs = (
        runs_of("stock", [400, 420, 380])
        + runs_of("single", [300, 310, 290])
        + runs_of("auto", [700, 560, 600])
    )
    # One prompt of one token per run, matching the workload in result_doc.
    return [
        replace(r, completed=1, output_tokens=1, output_tok_s=round(1 / r.window_s, 2))
        for r in runs
    ]


def test_tables_are_shaped_like_amds():
    configs = sample_configs()
    doc = result_doc(configs, runs_of("stock", [400, 420, 380]) + runs_of("auto", [700, 560, 600]))
    summaries = [results.Summary(**s) for s in doc["summary"]]
    amd = tables.amd_table(summaries, "tiny-llama").splitlines()
    assert amd[0] == "| Model | stock | auto | autovsstock |"
    assert amd[2] == "| tiny-llama | 400 | 600 | 1.500 |"
    text = report.markdown(doc)
    assert "| auto | 4 x 2 CPUs | 600 | 560-700 |" in text  # 2-core slices without SMT
    assert "1.500x" in text and "acceptance 1.3x: met" in text


def test_written_outputs_agree_and_pass_the_checker(tmp_path):
    configs = sample_configs()
    doc = result_doc(configs, consistent_runs())
    written = report.write_outputs(doc, tmp_path)
    assert {p.name for p in written} == {
        "results.json",
        "runs.csv",
        "summary.csv",
        "table.md",
        "throughput.png",
        "latency.png",
    }
    assert check.check_outputs(tmp_path, ["stock", "single", "auto"]) == []
    with (tmp_path / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["output_tok_s"]) for r in rows] == [r["output_tok_s"] for r in doc["runs"]]
    width, height = check.png_size(tmp_path / "throughput.png")
    assert width > 300 and height > 200


def test_checker_catches_each_kind_of_inconsistency(tmp_path):
    configs = sample_configs()
    doc = result_doc(configs, consistent_runs())
    report.write_outputs(doc, tmp_path)

    def broken(mutate, *expect):
        d = json.loads(json.dumps(doc))
        mutate(d)
        (tmp_path / "results.json").write_text(json.dumps(d))
        problems = check.check_outputs(tmp_path, ["stock", "single", "auto", "zen-auto"])
        for text in expect:
            assert any(text in p for p in problems), (text, problems)

    broken(lambda d: None, "configuration zen-auto is missing")
    broken(lambda d: d["summary"][1].update(ratio=1.6), "auto: ratio 1.6 is not")
    broken(lambda d: d["runs"].pop(), "auto: 2 runs, expected 3", "runs.csv: 9 rows")
    broken(
        lambda d: d["summary"][2].update(output_tok_s=301.0),
        "single: summary 301.0 is not the median",
    )
    broken(lambda d: d["runs"][0].update(failed=1), "stock repeat 1: 1 completed, 1 failed")
    broken(lambda d: d["meta"]["failures"].append("zen-auto: died"), "failed: zen-auto: died")
    (tmp_path / "results.json").write_text(json.dumps(doc))
    (tmp_path / "latency.png").write_bytes(b"not a png")
    assert check.check_outputs(tmp_path) == ["latency.png: missing or not a PNG image (None)"]


def test_median_helper_matches_statistics():
    configs = sample_configs()
    rates = [512.5, 498.25, 530.0, 505.0]
    s = results.summarize(runs_of("stock", rates), configs)[0]
    assert s.output_tok_s == round(statistics.median(rates), 1)


DOCS = Path(__file__).resolve().parents[2] / "docs" / "bench"


@pytest.mark.skipif(not (DOCS / "results.json").exists(), reason="no recorded full run")
def test_the_recorded_full_run_is_complete_and_consistent():
    """The full `make bench` run whose table and plots docs/benchmarks.md shows."""
    assert check.check_outputs(DOCS, ["stock", "single", "auto"]) == []
    result = json.loads((DOCS / "results.json").read_text())
    assert result["meta"]["workload"]["repeats"] >= 3
    assert result["meta"]["workload"]["input_len"] == 128


@pytest.mark.parametrize(("shape", "weight_gb"), [("qwen0.5b", 0.99), ("qwen1.5b", 3.09)])
def test_the_recorded_real_shape_runs_have_every_peer_and_the_planner_near_the_best(
    shape, weight_gb
):
    """`make bench`'s 0.5 B and 1.5 B runs whose figures docs/benchmarks.md quotes (issue 14)."""
    out = DOCS / shape
    peers = ["stock", "auto", "vllm-dp", "llamacpp", "llamacpp-q8"]
    assert check.check_outputs(out, peers) == []
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["weight_bytes"] / 1e9 == pytest.approx(weight_gb, abs=0.01)
    assert result["meta"]["workload"]["input_len"] == result["meta"]["workload"]["output_len"]
    assert {r["peer"] for r in result["peers"]} == {"stock", "vllm-dp", "llamacpp", "llamacpp-q8"}
    v = result["verdict"]
    assert v["near_best"] and v["planner_vs_best"] >= catalogue.NEAR_BEST
    assert check.main([str(out), "--near-best"]) == 0


def test_the_recorded_quantized_runs_compare_each_weights_with_bf16_in_one_run():
    """`make bench`'s 0.5 B bf16/W8A8/AWQ run, and the earlier one whose auto and single
    layouts of each copy the planner's 2-core minimum rests on (issue 16)."""
    for name, copies in (
        ("qwen0.5b-quant", {"auto-w8a8", "auto-awq"}),
        ("qwen0.5b-quant-layouts", {"auto-w8a8", "single-w8a8", "auto-awq", "single-awq"}),
    ):
        out = DOCS / name
        assert check.check_outputs(out, ["stock", "auto", *sorted(copies)]) == []
        result = json.loads((out / "results.json").read_text())
        assert {r["weights"] for r in result["weights"]} == copies
        labels = " ".join(c["summary"] for c in result["configurations"])
        assert "compressed-tensors W8A8 INT8" in labels and "AWQ INT4 (group 128)" in labels
    rate = {s["config"]: s for s in result["summary"]}
    assert rate["single-w8a8"]["output_min"] > 1.3 * rate["auto-w8a8"]["output_max"]


def test_the_gateway_touches_only_a_site_and_work_dir_zenvllm_wrote(tmp_path):
    from zenvllm.bench import gateway
    from zenvllm.deploy import outputs

    d = gateway.Deployment(
        work=tmp_path / ".out.gateway",
        model_dir=tmp_path / "model",
        image="zenvllm/vllm-openai:0.32.0",
        port=8491,
        base_port=8492,
        serve_args=(),
        max_model_len=512,
        site_dir=tmp_path / "conf.d",
    )
    d.site_dir.mkdir()
    d.site.write_text("server { listen 8491; }\n")  # the operator's own
    with pytest.raises(UserError, match=re.escape(f"{d.site} exists and zenvllm did not")):
        gateway.check_paths(d)
    d.work.mkdir()
    (d.work / "notes.txt").write_text("mine\n")
    with pytest.raises(UserError, match=r"the gateway's work directory .* did not make"):
        gateway.check_paths(d)
    gateway.remove_own_files(d)
    assert d.site.read_text() == "server { listen 8491; }\n"
    assert (d.work / "notes.txt").read_text() == "mine\n"

    (d.work / "notes.txt").unlink()
    d.work.rmdir()
    outputs.claim(d.work, "the gateway's work directory")
    d.site.write_text("# managed\n# zenvllm gateway: one endpoint\nupstream x {}\n")
    gateway.check_paths(d)  # both zenvllm's: accepted
    gateway.remove_own_files(d)
    assert not d.site.exists() and not d.work.exists()
    # Every path deploy.yml writes for it is in its work directory or its site, none in the
    # host's own /var/lib/zenvllm (the revisions' default root).
    written = {k: v for k, v in d.variables().items() if k.endswith(("_dir", "_path"))}
    assert written["zenvllm_instances_revisions_dir"].startswith(str(d.work)), written
    assert not [v for v in written.values() if str(v).startswith("/var/lib/zenvllm")], written


def test_nginx_is_named_by_its_pid_file_and_its_binary_and_only_nginx_is_signalled(
    tmp_path, monkeypatch
):
    """A pid file a killed nginx left names another process once the pid is reused:
    that process is neither taken for nginx nor signalled."""
    from zenvllm.bench import gateway

    pid_file = tmp_path / "nginx.pid"
    monkeypatch.setattr(gateway, "NGINX_PID", pid_file)
    assert gateway.nginx_master() is None  # no file
    fake = tmp_path / "nginx"  # a process whose binary is named nginx
    shutil.copy("/bin/sleep", fake)
    default_quit = lambda: signal.signal(signal.SIGQUIT, signal.SIG_DFL)  # noqa: E731
    other = subprocess.Popen(["/bin/sleep", "60"], preexec_fn=default_quit)
    master = subprocess.Popen([str(fake), "60"], preexec_fn=default_quit)
    try:
        for text, want in [("", None), ("x\n", None), ("99999999\n", None),
                           (f"{other.pid}\n", None), (f"{master.pid}\n", master.pid)]:  # fmt: skip
            pid_file.write_text(text)
            assert gateway.nginx_master() == want, text
        pid_file.write_text(f"{other.pid}\n")
        assert gateway.signal_nginx(signal.SIGQUIT) is False
        assert other.poll() is None
        pid_file.write_text(f"{master.pid}\n")
        gateway.stop_nginx(timeout_s=5)
        assert master.wait(5) == -signal.SIGQUIT  # the graceful stop was enough
    finally:
        for proc in (other, master):
            proc.kill()
            proc.wait()


def test_vllm_dp_runs_one_rank_per_planner_slice_in_one_container():
    fixture = host("vm-milan-8vcpu-avx2")
    configs, _ = layouts.resolve(["stock", "auto", "vllm-dp"], fixture, TINY, 8401, 512)
    by_name = {c.name: c for c in configs}
    auto, dp = by_name["auto"], by_name["vllm-dp"]
    (server,) = dp.servers
    ranks = [s.omp_bind for s in auto.servers]
    assert len(ranks) > 1 and server.omp_bind == "|".join(ranks)
    assert server.env["VLLM_CPU_OMP_THREADS_BIND"] == "|".join(ranks)
    assert "ZENVLLM_PLAN" not in server.env
    assert dp.shape == f"1 x {len(ranks)} DP ranks"
    union = sorted(c for s in auto.servers for c in layouts.cpu_ids(s.cpus))
    assert layouts.cpu_ids(server.cpus) == union
    argv = launch.server_launch(server, bench_settings(), "r1").argv
    assert argv[argv.index("--data-parallel-size") + 1] == str(len(ranks))
    assert argv[argv.index("--entrypoint") + 1] == "vllm"  # vLLM's own, no launcher
    assert f"--cpuset-cpus={server.cpus}" in argv and "--port" in argv
    # The result document keeps it, and reads it back whole.
    again = document.configs_from_dicts([document.config_dict(dp, "img:1")])
    assert again[0].servers[0].serve_args == server.serve_args


@pytest.mark.parametrize(
    ("fixture", "ranks"),
    [("test-machine-zen4-2cpu", ["0", "1"]), ("epyc-9654-nps4", None)],
)
def test_a_split_copy_runs_one_rank_per_node_or_per_half_of_a_lone_node(fixture, ranks):
    """vllm-tp and vllm-pp: vLLM's own command, one container, one copy over the ranks
    the planner would split it into (a node each), or two halves of a one-node host."""
    machine = host(fixture)
    nodes = sorted({c.node for c in machine.cpus})
    configs, _ = layouts.resolve(["stock", "vllm-tp", "vllm-pp"], machine, TINY, 8401, 512)
    by_name = {c.name: c for c in configs}
    flags = {"vllm-tp": "--tensor-parallel-size", "vllm-pp": "--pipeline-parallel-size"}
    for name, flag in flags.items():
        (server,) = by_name[name].servers
        binds = server.omp_bind.split("|")
        if ranks is not None:
            assert binds == ranks
        else:  # a rank per node, each on that node's CPUs only
            assert len(binds) == len(nodes) > 1
            for bind, node in zip(binds, nodes, strict=True):
                assert {machine.cpu(c).node for c in layouts.cpu_ids(bind)} == {node}
        assert server.env["VLLM_CPU_OMP_THREADS_BIND"] == server.omp_bind
        argv = launch.server_launch(server, bench_settings(), "r1").argv
        assert argv[argv.index(flag) + 1] == str(len(binds))
        assert argv[argv.index("--entrypoint") + 1] == "vllm"
        assert by_name[name].shape == f"1 x {len(binds)} {name[-2:].upper()} ranks"
    # The same slices, another split: never folded into each other.
    assert by_name["vllm-tp"].signature() != by_name["vllm-pp"].signature()


def test_a_split_copy_reads_its_weights_over_every_rank_in_the_roofline():
    configs, _ = layouts.resolve(
        ["stock", "two-per-node", "vllm-tp"], host("test-machine-zen4-2cpu"), TINY, 8401, 512
    )
    summaries = [
        results.Summary(name, "x", 1, 10, 10, 10, 20, 5, 5, 5, 50.0, 50.0, 50.0, None)
        for name in ("stock", "two-per-node", "vllm-tp")
    ]
    meta = {"weight_bytes": 10**9, "core_bandwidth_gbs": 2.5, "host_cores": 2}
    rows = {r["config"]: r for r in roofline.roofline(summaries, configs, meta)}
    # Two replicas of one core each read a copy per step; the split reads one over both.
    assert rows["two-per-node"]["bandwidth_gbs"] == 2.5
    assert rows["vllm-tp"]["bandwidth_gbs"] == 5.0
    assert rows["vllm-tp"]["percent"] == rows["two-per-node"]["percent"] / 2


def test_an_eager_run_leaves_the_pipeline_out_and_says_why():
    from zenvllm.bench import commands_bench

    configs, _ = layouts.resolve(
        ["stock", "vllm-tp", "vllm-pp"], host("test-machine-zen4-2cpu"), TINY, 8401, 512
    )
    notes: list[str] = []
    eager = replace(workloads.QUICK, enforce_eager=True)
    kept = commands_bench.without_eager_pipelines(configs, eager, notes)
    assert [c.name for c in kept] == ["stock", "vllm-tp"]
    assert notes == [
        "vllm-pp: skipped: vLLM 0.32 on CPU fails the first request of a pipeline "
        "without its compile warm-up"
    ]
    compiled = replace(eager, enforce_eager=False)
    assert commands_bench.without_eager_pipelines(configs, compiled, []) == configs


def test_the_roofline_compares_weight_bytes_streamed_with_the_cores_bandwidth():
    one_gb = replace(TINY, weight_bytes=10**9)
    configs, _ = layouts.resolve(
        ["stock", "auto", "vllm-dp", "gateway"], host("vm-milan-8vcpu-avx2"), one_gb, 8401, 512
    )
    by_name = {c.name: c for c in configs}
    summaries = [
        results.Summary(name, "x", 1, 10, 10, 10, 20, 5, 5, 5, tpot, tpot, tpot, None)
        for name, tpot in (("stock", 100.0), ("auto", 50.0), ("vllm-dp", 50.0), ("gateway", 60.0))
    ]
    meta = {"weight_bytes": 10**9, "core_bandwidth_gbs": 2.5, "host_cores": 4}
    rows = {r["config"]: r for r in roofline.roofline(summaries, configs, meta)}
    # 1 GB per step every 100 ms: 10 GB/s, over stock's 4 cores x 2.5 GB/s = 100 %.
    assert rows["stock"] == {
        "config": "stock",
        "weight_gbs": 10.0,
        "bandwidth_gbs": 10.0,
        "percent": 100.0,
        "batch1_weight_gbs": None,  # no batch-1 figures here
        "batch1_bandwidth_gbs": None,
        "batch1_percent": None,
    }
    cores = [len(layouts.cpu_ids(s.omp_bind)) for s in by_name["auto"].servers]
    # Per instance: each reads its own weights, in float32 on this AVX2-only host (twice
    # the stored bf16 bytes; stock serves bf16).
    assert rows["auto"]["weight_gbs"] == 40.0
    assert rows["auto"]["bandwidth_gbs"] == round(2.5 * sum(cores) / len(cores), 2)
    assert rows["vllm-dp"]["bandwidth_gbs"] == rows["auto"]["bandwidth_gbs"]  # a rank a slice
    assert "gateway" not in rows  # no servers of its own to measure against
    assert roofline.roofline(summaries, configs, {**meta, "weight_bytes": 0}) == []  # size unknown


def test_a_server_in_float32_counts_twice_the_bf16_bytes_per_step():
    """On an AVX2-only host the planner serves float32: each decode step streams twice
    the stored bf16 weights, and the roofline counts those; stock in bf16 keeps them."""
    names = ["stock", "auto"]
    configs, _ = layouts.resolve(names, host("vm-milan-8vcpu-avx2"), TINY, 8401, 512)
    stock, auto = configs
    assert stock.servers[0].weight_bytes == 0  # --model's, as stored
    assert {s.weight_bytes for s in auto.servers} == {2 * TINY.weight_bytes}
    assert roofline.step_bytes(auto, TINY.weight_bytes) == 2 * TINY.weight_bytes
    on_zen4, _ = layouts.resolve(names, host("test-machine-zen4-2cpu"), TINY, 8401, 512)
    assert {s.weight_bytes for c in on_zen4 for s in c.servers} == {0}


def test_only_a_stopped_container_of_a_bench_run_is_cleared_from_a_name():
    assert servers.in_the_way("zenvllm-bench-8401-0", "auto", "false 0dead000\n") == "0dead000"
    for inspected, says in [
        ("true 0dead000", "still running, of bench run 0dead000"),
        ("false <no value>", "not zenvllm bench's"),
        ("true <no value>", "not zenvllm bench's"),
    ]:
        with pytest.raises(UserError, match=f"zenvllm-bench-8401-0 already exists \\({says}\\)"):
            servers.in_the_way("zenvllm-bench-8401-0", "auto", inspected)
