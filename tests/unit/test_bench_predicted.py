"""Every bench run checks the performance model (issue 66, bench/predicted.py): each
configuration's row gives predicted and measured output tok/s, TPOT and TTFT and their
ratio, or why the model does not cover it; bench/check.py derives the rows again and
fails a run whose planner layout is off its prediction by more than the model's bound,
a peer's miss reported only; a model whose weights fit in the host's L3 caches is
predicted, not checked. The recorded runs are docs/bench's, their meta completed with
what the bench records now (tests/support/recorded_runs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.recorded_runs import BENCH, recorded
from test_bench_kinds import HOST, TINY, fake_engine

from zenvllm.bench import (
    check,
    document,
    kinds,
    layouts,
    predicted,
    report,
    runner,
    workloads,
)
from zenvllm.bench.measuring import Settings
from zenvllm.bench.roofline import Bandwidth
from zenvllm.core import performance


def written(doc: dict, out: Path) -> Path:
    """The document derived from its raw data, as the bench writes it (plots too)."""
    out.mkdir(parents=True, exist_ok=True)
    report.write_outputs(doc | document.derive(doc), out)
    return out


def rows_of(doc: dict) -> dict[str, dict]:
    return {r["config"]: r for r in document.derive(doc)["predictions"]}


def halved(doc: dict, name: str) -> dict:
    """`name`'s repeats took twice as long: half its measured output tok/s."""
    for r in doc["runs"]:
        if r["config"] == name:
            r["window_s"] *= 2
            r["output_tok_s"] = r["output_tokens"] / r["window_s"]
            r["total_tok_s"] /= 2
            r["request_s"] /= 2
    return doc


# -- the recorded runs --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run", "covered", "skipped"),
    [
        ("qwen0.5b-split", ["stock", "auto", "two-per-node", "vllm-tp", "vllm-pp"], []),
        ("qwen1.5b", ["stock", "auto", "two-per-node", "vllm-dp"], ["llamacpp", "llamacpp-q8"]),
    ],
)
def test_a_recorded_run_gets_a_row_per_configuration_and_its_planner_is_within_the_bound(
    run, covered, skipped
):
    doc = recorded(run)
    rows = rows_of(doc)
    print(predicted.predictions_table(list(rows.values())))  # pytest -s shows it
    assert list(rows) == [c["name"] for c in doc["configurations"]]
    summary = {s["config"]: s for s in doc["summary"]}
    for name in covered:
        r = rows[name]
        assert r["within"] is True and r["note"] == "", r  # every one, peers too, here
        assert r["output_tok_s"] == summary[name]["output_tok_s"]
        assert r["output_tok_s_ratio"] == round(r["output_tok_s"] / r["predicted_output_tok_s"], 3)
        # Latencies are shown, not bound: within 25% on these runs (stock's TPOT the worst).
        assert 0.75 < r["tpot_ms_ratio"] < 1.2 and 0.75 < r["ttft_ms_ratio"] < 1.2
    for name in skipped:
        assert rows[name]["within"] is None and rows[name]["predicted_output_tok_s"] is None
        assert rows[name]["note"] == f"not predicted: {predicted.LLAMACPP}"
    assert predicted.planner_problems(list(rows.values())) == []


def test_a_recorded_run_without_the_models_inputs_says_why_and_still_passes_the_check():
    """docs/bench's documents predate the meta the model needs: no row is predicted and
    none is stored, so the check asks for none (the recorded runs stay checkable)."""
    doc = json.loads((BENCH / "qwen1.5b" / "results.json").read_text())
    rows = rows_of(doc)
    assert {r["note"] for n, r in rows.items() if not n.startswith("llamacpp")} == {
        "not predicted: the run recorded no CPU flags (written before the bench did)"
    }
    assert check.check_outputs(BENCH / "qwen1.5b") == []


def test_a_run_written_with_its_predictions_passes_the_check_and_shows_the_table(tmp_path):
    out = written(recorded("qwen0.5b-split"), tmp_path / "run")
    assert check.check_outputs(out) == []
    stored = json.loads((out / "results.json").read_text())["predictions"]
    auto = next(r for r in stored if r["config"] == "auto")
    assert (auto["predicted_output_tok_s"], auto["output_tok_s"]) == (129.5, 132.1)
    table = (out / "table.md").read_text()
    assert "Predicted against measured" in table and "bound is ±18% on output tok/s" in table
    assert (
        "| auto | 129.5 | 132.1 | 1.020x | 94.6 | 89.762 | 0.949x | 3707.9 | 4060.94 | 1.095x "
        "| within ±18% |"
    ) in table
    assert all(predicted.prediction_row(r) in table for r in stored)


# -- sabotaged ----------------------------------------------------------------------------


def test_the_planner_measured_at_half_its_prediction_fails_the_check(tmp_path, capsys):
    out = written(halved(recorded("qwen0.5b-split"), "auto"), tmp_path / "run")
    problems = check.check_outputs(out)
    assert problems == [
        "auto: predicted 129.5 output tok/s (TPOT 94.6 ms), measured 66 (TPOT 89.762 ms): off "
        "by +96.2%, beyond the performance model's bound of 18% (core/performance.py): the "
        "model or the run's bandwidth figure is wrong"
    ]
    assert check.main([str(out)]) == 1
    assert "auto: predicted 129.5 output tok/s" in capsys.readouterr().out
    assert "| auto | 129.5 | 66 | 0.510x |" in (out / "table.md").read_text()


def test_a_peer_off_its_prediction_is_reported_not_failed(tmp_path):
    out = written(halved(recorded("qwen0.5b-split"), "vllm-tp"), tmp_path / "run")
    assert check.check_outputs(out) == []
    assert "| vllm-tp | 129.5 | 56.3 | 0.435x |" in (out / "table.md").read_text()
    assert "BEYOND ±18% |" in (out / "table.md").read_text()


@pytest.mark.parametrize(
    ("run", "scale"), [("qwen1.5b", 2.0), ("qwen1.5b", 0.5), ("qwen0.5b-split", 0.5)]
)
def test_a_bandwidth_off_by_2x_fails_the_check(run, scale):
    doc = recorded(run)
    doc |= document.derive(doc)  # its predictions stored, then the figure sabotaged
    doc["meta"]["core_bandwidth_gbs"] *= scale
    doc["meta"]["core_alone_gbs"] = (doc["meta"].get("core_alone_gbs") or 0.0) * scale
    problems = kinds.GENERATION_KIND.derived_problems(doc)
    assert any(p.startswith("predictions: auto predicted_output_tok_s is ") for p in problems)
    assert any(p.startswith("auto: predicted ") and "beyond" in p for p in problems), problems


@pytest.mark.parametrize(
    ("moved", "beyond"), [(0.52, True), (0.8, False), (1.1, False), (1.3, True)]
)
def test_the_table_says_how_far_the_bandwidth_moved_during_the_run(tmp_path, moved, beyond):
    """The bench's figure measured again at the end (meta.bandwidth_end_gbs), beside the
    start's in the roofline's line; beyond 25% the table says its roofline and
    predictions are uncertain by that much (0.52: the Zen 5 VM's two runs hours apart,
    15.46 against 29.79 GB/s per core). Reported, not failed: bench.check passes it."""
    doc = json.loads((BENCH / "qwen0.5b-rounds" / "results.json").read_text())  # meta whole
    start = doc["meta"]["core_bandwidth_gbs"]
    doc["meta"]["bandwidth_end_gbs"] = end = round(start * moved, 2)
    out = written(doc, tmp_path / "run")
    assert check.check_outputs(out) == []
    table = (out / "table.md").read_text()
    assert f"measured again at the run's end: {end:g} GB/s ({moved - 1:+.0%})" in table
    assert ("beyond ±25%: the machine changed during the run" in table) is beyond


def test_on_the_zen4_run_a_doubled_bandwidth_stays_within_the_bound():
    """What the check cannot see there: at 16 sequences a step of the 0.5 B shape on Zen 4
    is mostly arithmetic (57 of 104 ms), so twice the bandwidth predicts 6% more than
    measured; half of it is caught (above)."""
    doc = recorded("qwen0.5b-split")
    doc["meta"]["core_bandwidth_gbs"] *= 2
    doc["meta"]["core_alone_gbs"] *= 2
    assert rows_of(doc)["auto"]["within"] is True


# -- the L3 rule, through the bench's own runner ------------------------------------------


def fake_run(tmp_path: Path, l3_bytes: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """stock and auto of the 2 MiB test model on the fakes, with a bandwidth and the
    model's inputs as the bench records them."""
    fake_engine(monkeypatch)
    configs, _ = layouts.resolve(["stock", "auto"], HOST, TINY, 8401, 512)
    measured = Bandwidth(14.03, 18.71, 2, "test", l3_bytes=l3_bytes)
    settings = Settings(
        model_dir=tmp_path, model_name="tiny", images={"vllm-openai": "v"},
        workload=workloads.QUICK, max_model_len=512, out_dir=tmp_path / "out", plots=True,
        weight_bytes=TINY.weight_bytes, bandwidth=measured, host_cores=2,
        performance=predicted.meta_of(HOST, TINY, []),
    )  # fmt: skip
    result, status = runner.run_bench(kinds.GENERATION_KIND, configs, settings)
    assert status == 0, result["meta"]["failures"]
    return tmp_path / "out"


def test_a_model_in_the_l3_caches_is_predicted_not_checked(tmp_path, monkeypatch):
    out = fake_run(tmp_path, 32 * 2**20, monkeypatch)
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["cpu_generation"] == HOST.generation
    assert result["meta"]["flops_per_token"] == {"": TINY.weight_bytes}
    for r in result["predictions"]:
        assert r["predicted_output_tok_s"] > 0 and r["within"] is None
        assert r["note"].startswith("not checked: its 2.1 MB of weights fit in the host's L3")
    assert check.check_outputs(out) == []
    assert "| auto |" in (out / "table.md").read_text()


def test_the_same_model_out_of_the_caches_is_checked(tmp_path, monkeypatch):
    """The fakes' tokens/s are not a 2 MiB model's on 2 cores: held to the model, auto fails."""
    out = fake_run(tmp_path, 0, monkeypatch)
    problems = check.check_outputs(out)
    assert len(problems) == 1 and problems[0].startswith("auto: predicted "), problems


def test_what_the_bench_records_for_the_model():
    from zenvllm.core.model import Model
    from zenvllm.core.quantization import Quantization

    int4 = Quantization("awq", "AWQ INT4 (group 128)", bits=4)
    awq = Model("awq", weight_bytes=458_259_200, float_bytes=272_000_000, quantization=int4)
    facts = predicted.meta_of(HOST, TINY, [("/models/awq", awq)])
    assert set(facts["cpu_flags"]) <= set(predicted.COMPUTE_FLAGS)
    assert "avx512_bf16" in facts["cpu_flags"] and facts["cpu_generation"] == "Zen 4"
    assert facts["kv_bytes_per_token"] == 1024 and facts["model_dtype"] == "bfloat16"
    assert facts["flops_per_token"] == {
        "": TINY.weight_bytes,  # 2 FLOPs per 2-byte weight
        "/models/awq": performance.shape_of(awq).flops_per_token,
    }


@pytest.mark.parametrize(
    ("run", "caught"), [("qwen0.5b-rounds", 2.0), ("qwen0.5b-rounds-reversed", 0.5)]
)
def test_on_the_zen5_rounds_runs_a_bandwidth_off_by_2x_is_caught_one_way(run, caught):
    """At 16 sequences a 0.5 B step on Zen 5 is mostly arithmetic: 2x moves the
    prediction by about a quarter, so which way is caught depends on where the run's own
    figure and error sit (the bench tier's speed guard test prints both ways)."""
    doc = json.loads((BENCH / run / "results.json").read_text())
    for scale in (0.5, 2.0):
        off = json.loads(json.dumps(doc))
        off["meta"]["core_bandwidth_gbs"] *= scale
        off["meta"]["core_alone_gbs"] *= scale
        assert (rows_of(off)["auto"]["within"] is False) is (scale == caught), (run, scale)


# -- a machine that changed during the run -------------------------------------------------


def slowed(doc: dict, name: str, factor: float) -> dict:
    """`name`'s repeats made `factor` of their output tok/s (a machine slower by then)."""
    for r in doc["runs"]:
        if r["config"] == name:
            r["window_s"] /= factor
            r["output_tok_s"] = r["output_tokens"] / r["window_s"]
            r["total_tok_s"] *= factor
            r["request_s"] *= factor
    return doc


def test_a_planner_slowed_with_the_machine_is_judged_against_the_runs_lower_figure(tmp_path):
    """The fresh Zen 4 CI run of 1b1c708: its bandwidth measured 14.37 GB/s per core busy
    at the start and 12.94 at the end, and auto made 0.840x its prediction from the start's.
    A prediction from either figure is one the run measured, so the planner is within the
    bound when it is of some prediction between the two; off both, it fails, and a
    bandwidth off by 2x in every figure is still caught."""
    doc = slowed(recorded("qwen0.5b-split"), "auto", 0.8)
    assert rows_of(doc)["auto"]["within"] is False  # one figure: beyond the bound
    figure = doc["meta"]["core_bandwidth_gbs"]
    doc["meta"]["bandwidth_end_gbs"] = round(figure * 0.6, 2)
    auto = rows_of(doc)["auto"]
    assert auto["within"] is True, auto
    assert auto["predicted_output_tok_s_low"] < auto["predicted_output_tok_s"]
    assert auto["note"].startswith("within ±18% of ")
    assert f"lower figure ({figure * 0.6:.2f}".rstrip("0") in auto["note"]
    out = written(doc, tmp_path / "run")
    assert check.check_outputs(out) == []
    assert "predicted from the run's lower figure" in (out / "table.md").read_text()
    # A run the lower figure does not explain either still fails.
    halved_too = slowed(json.loads(json.dumps(doc)), "auto", 0.5)
    assert rows_of(halved_too)["auto"]["within"] is False
    wrong = json.loads(json.dumps(doc))  # every figure of the run off by 2x
    for key in ("core_bandwidth_gbs", "core_alone_gbs", "bandwidth_end_gbs"):
        wrong["meta"][key] *= 2
    assert rows_of(wrong)["auto"]["within"] is False
