"""The speed guard's arithmetic on recorded result files: ratios of one run against a
floor from the recorded runs less their spread (the real runs are in tests/bench)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from zenvllm.bench import catalogue, guard

RECORDED = sorted(guard.RECORDED.glob("*/results.json"))


@pytest.fixture(scope="module")
def recorded() -> list[dict]:
    docs = [json.loads(p.read_text()) for p in RECORDED]
    return [d for d in docs if d["meta"].get("kind") != "embed"]  # generation runs only


@pytest.fixture(scope="module")
def half_b(recorded) -> dict:
    return next(d for d in recorded if d["meta"]["run_id"] == "26328e42")  # qwen0.5b


def test_the_floor_is_the_lowest_recorded_repeat_less_the_spread(recorded):
    pooled = [
        r
        for d in recorded
        if d["meta"]["model"] == "bench-0.5b"
        and d["meta"]["cpus"] == 2
        and not d["meta"].get("serve_env")
        and guard.dtypes(d["meta"]) == ("bfloat16", "bfloat16")
        for r in guard.repeat_ratios(d)
    ]
    limit, basis = guard.floor(recorded, "bench-0.5b", 2)
    assert limit == round(2 * min(pooled) - max(pooled), 3)
    assert 1.0 < limit < min(pooled) and f"{len(pooled)} recorded repeats" in basis


def test_a_recorded_run_passes_its_own_guard(recorded, half_b):
    ok, sentence = guard.judge(half_b, recorded)
    assert ok and sentence.startswith("speed guard holds: auto / stock = 1.792x")


def test_the_planner_with_stocks_figures_fails(recorded, half_b):
    sabotaged = copy.deepcopy(half_b)
    stock = {r["repeat"]: r["output_tok_s"] for r in half_b["runs"] if r["config"] == "stock"}
    for run in sabotaged["runs"]:
        if run["config"] == "auto":
            run["output_tok_s"] = stock[run["repeat"]] * 1.02
    ok, sentence = guard.judge(sabotaged, recorded)
    assert not ok and "speed guard FAILED: auto / stock = 1.020x" in sentence


def test_eager_runs_other_models_and_other_hosts_set_no_floor(recorded):
    assert guard.floor(recorded, "bench-0.5b", 64) is None
    eager = copy.deepcopy(recorded)
    for d in eager:
        d["meta"]["workload"]["enforce_eager"] = True
    assert guard.floor(eager, "bench-0.5b", 2) is None
    ok, sentence = guard.judge(recorded[0] | {"meta": {"model": "x", "cpus": 2}}, recorded)
    assert not ok and "no recorded compiled-mode run of x on 2 CPUs" in sentence


def test_the_command_exits_1_on_a_failed_guard_and_2_on_a_bad_file(tmp_path, half_b, capsys):
    sabotaged = copy.deepcopy(half_b)
    for run in sabotaged["runs"]:
        run["output_tok_s"] = 100.0
    (tmp_path / "results.json").write_text(json.dumps(sabotaged))
    assert guard.main([str(tmp_path)]) == 1
    assert "FAILED" in capsys.readouterr().out
    (tmp_path / "results.json").write_text("{not json")
    assert guard.main([str(tmp_path)]) == 2
    assert guard.main([str(Path(tmp_path, "absent"))]) == 2


def test_a_run_with_serve_env_sets_no_floor(recorded, half_b):
    """--serve-env runs are experiments on the plan (or sabotage): never a reference."""
    experiment = copy.deepcopy(half_b)
    experiment["meta"]["serve_env"] = {"VLLM_CPU_OMP_THREADS_BIND": "auto"}
    assert guard.floor([experiment], "bench-0.5b", 2) is None


def test_config_judges_another_configuration_of_the_run_as_the_plan(recorded, half_b):
    """--config NAME: the run's NAME over its stock, against the plan's recorded floor
    (CI's sabotaged plan, auto-stock-bind, measured beside auto in the same run)."""
    run = copy.deepcopy(half_b)
    stock = {r["repeat"]: r["output_tok_s"] for r in half_b["runs"] if r["config"] == "stock"}
    run["runs"] += [
        {"config": "auto-stock-bind", "repeat": n, "output_tok_s": tok_s * 1.05}
        for n, tok_s in stock.items()
    ]
    ok, sentence = guard.judge(run, recorded, "auto-stock-bind")
    assert not ok and sentence.startswith("speed guard FAILED: auto-stock-bind / stock = 1.050x")
    assert guard.judge(run, recorded)[0]  # the plan itself, in the same run, holds
    assert guard.judge(run, recorded, "no-such")[1].startswith("no no-such and stock figures")


def test_the_command_judges_the_configuration_it_is_given(tmp_path, half_b, capsys):
    run = copy.deepcopy(half_b)
    run["runs"] += [
        {**r, "config": "auto-stock-bind"} for r in half_b["runs"] if r["config"] == "stock"
    ]
    (tmp_path / "results.json").write_text(json.dumps(run))
    assert guard.main([str(tmp_path)]) == 0
    assert guard.main([str(tmp_path), "--config", "auto-stock-bind"]) == 1
    assert "speed guard FAILED: auto-stock-bind / stock = 1.000x" in capsys.readouterr().out


def with_dtypes(doc: dict, stock_dtype: str, plan_dtype: str, plan_gain: float = 1.0) -> dict:
    """doc as a run with stock and the plan in those dtypes, the plan's figures x plan_gain."""
    run = copy.deepcopy(doc)
    run["meta"] |= {"stock_dtype": stock_dtype, "plan_dtype": plan_dtype}
    for r in run["runs"]:
        if r["config"] == "auto":
            r["output_tok_s"] *= plan_gain
    return run


def test_each_pair_of_dtypes_is_judged_against_runs_of_that_pair_only(recorded, half_b):
    """On an AVX2-only CPU the plan serves float32 against stock's emulated bf16: a ratio
    that counts the dtype, judged only against runs that counted it too."""
    mixed = with_dtypes(half_b, "bfloat16", "float32")  # 1.792x
    ok, sentence = guard.judge(mixed, recorded)
    assert not ok and "with stock in bfloat16 and the plan in float32" in sentence
    assert guard.floor([mixed], "bench-0.5b", 2) is None  # not a bf16 run's floor
    avx2 = with_dtypes(half_b, "bfloat16", "float32", plan_gain=2)  # 3.584x recorded
    ok, sentence = guard.judge(mixed, [*recorded, avx2])
    assert not ok and sentence.startswith("speed guard FAILED: auto / stock = 1.792x")
    assert "stock in bfloat16 and the plan in float32, in 1 run(s)" in sentence
    assert guard.judge(avx2, [*recorded, avx2])[0]  # a run as good as the recorded one
    assert guard.judge(half_b, [*recorded, avx2])[0]  # bf16 runs keep their own floor


def test_the_sabotaged_plan_is_a_configuration_the_bench_runs():
    assert guard.SABOTAGED == "auto-stock-bind"
    assert {guard.SABOTAGED, "auto-stock-dtype"} <= set(catalogue.SPECS)


def test_the_runs_under_the_avx2_view_are_kept_apart_from_the_real_cpus():
    """A real Zen 3's float32 runs set their own floor, far above the view's 1.0x."""
    real = guard.recorded_documents()
    view = guard.recorded_documents(guard.VIEW_RECORDED)
    assert view and all("7763" in d["meta"]["host"] for d in view)
    assert not any("7763" in d["meta"]["host"] for d in real)
    limit, basis = guard.floor(real, "bench-0.5b", 2, ("float32", "float32")) or (0, "")
    assert limit > 1.3 and "in 1 run(s)" in basis, basis
    below, _ = guard.floor(view, "bench-0.5b", 2, ("float32", "float32")) or (9, "")
    assert below < 1.0
