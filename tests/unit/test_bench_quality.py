"""Quality beside speed in the bench (issue 65): each configuration of a generating model
scored through its first server against the float32 reference (a configuration of its
own, measured first), judged within its format's bound (core/quality.py), shown beside
its tokens/s, never the best when beyond it; a sabotaged run (a server whose logprobs
are wrong) is BEYOND, and when it is the planner's layout the check fails.

The engine, the clients and the servers' answers are the fakes of test_bench_kinds.py;
everything between them is the bench's own code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_kinds import HOST, TINY, FakeEngine, FakePool, FakeServers, fake_engine

from zenvllm.bench import check, generation, kinds, layouts, quality, runner, scored, workloads
from zenvllm.bench.measuring import Settings
from zenvllm.core import gate
from zenvllm.core import quality as judging

PLANNER_SERVERS = "zenvllm-bench-8401-"  # the planner's instances' container names


@pytest.fixture
def engine(monkeypatch) -> FakeEngine:
    return fake_engine(monkeypatch)


def bench(tmp_path: Path, names: list[str], out: str = "out") -> tuple[dict, Path]:
    """The generating model's bench over `names`, the float32 reference first."""
    configs, _ = layouts.resolve(names, HOST, TINY, 8401, 512)
    configs, notes = generation.with_reference(configs, 8401, TINY)
    assert notes == [] and configs[0].name == "reference-f32"
    assert configs[0].shape == "1 x all CPUs"  # vLLM's own command, as stock's
    settings = Settings(
        model_dir=tmp_path, model_name="tiny", images={"vllm-openai": "v"},
        workload=workloads.QUICK, max_model_len=512, out_dir=tmp_path / out, plots=True,
    )  # fmt: skip
    result, status = runner.run_bench(kinds.GENERATION_KIND, configs, settings)
    assert status == 0, result["meta"]["failures"]
    return result, tmp_path / out


def rows(result: dict) -> dict[str, dict]:
    return {r["config"]: r for r in result["quality"]}


def test_every_configuration_is_scored_against_the_float32_reference_measured_first(
    engine, tmp_path
):
    names = ["stock", "auto", "vllm-dp"]
    result, out = bench(tmp_path, names)
    started = [c for c in engine.calls if c[0] == "run"]
    assert "zenvllm-bench-reference-8401" in started[0]  # alone, before stock
    assert "float32" in started[0]
    judged = rows(result)
    assert list(judged) == ["reference-f32", *names]
    assert judged["reference-f32"]["format"] == "float32"
    assert judged["stock"]["format"] == "bfloat16"
    for r in judged.values():
        assert r["within"] is True and r["gap"] == 0 and r["greedy_agreement"] == 1.0
    raw = result["quality_runs"][0]
    assert raw["text"] == "heldout.txt" and raw["scored_tokens"] > 1000  # the shipped prose
    assert len(raw["greedy"]) == judging.GREEDY_TOKENS
    assert not any(r["config"] == "reference-f32" for r in result["runs"])  # scored only
    assert check.check_outputs(out, names) == []
    table = (out / "table.md").read_text()
    assert "quality vs float32 |" in table and "+0.00%, 100% agree |" in table
    assert scored.line(judged["auto"]) in table
    assert (out / "quality.csv").read_text().startswith(",".join(scored.COLUMNS))


def test_a_sabotaged_planner_layout_is_beyond_its_bound_and_fails_the_check(
    engine, tmp_path, capsys
):
    FakeServers.sabotaged = PLANNER_SERVERS  # its kernels return wrong numbers
    result, out = bench(tmp_path, ["stock", "auto"])
    auto = rows(result)["auto"]
    assert auto["within"] is False and auto["gap"] == pytest.approx(0.15)
    assert auto["greedy_agreement"] == 0.25  # 8 of 32 tokens before it strays
    assert rows(result)["stock"]["within"] is True
    v = result["verdict"]
    assert v["beyond_bound"] == ["auto"] and v["planner_within"] is False
    assert v["best_overall"] == "stock" and not v["planner_is_best_layout"]
    problems = check.check_outputs(out)
    assert problems == [
        "auto: quality beyond its bound: perplexity "
        f"{auto['perplexity']:.4f} against {auto['reference']:.4f} in float32: +15.00%, "
        "BEYOND bfloat16's bound of 2.0%; greedy agreement 25.0%"
    ]
    assert check.main([str(out)]) == 1
    assert "auto: quality beyond its bound" in capsys.readouterr().out
    table = (out / "table.md").read_text()
    assert "BEYOND +15.00%, 25% agree" in table and "**BEYOND**" in table
    assert "the planner's layout among them: it fails the check" in table


def test_the_fastest_configuration_beyond_its_bound_is_never_the_best(engine, tmp_path):
    names = ["stock", "auto", "vllm-dp"]
    FakePool.fast = "vllm-dp"
    result, _ = bench(tmp_path, names, "clean")
    assert result["verdict"]["best_overall"] == "vllm-dp"
    assert result["verdict"]["best_same_weights"] == "vllm-dp"
    FakeServers.sabotaged = "zenvllm-bench-dp-"
    result, out = bench(tmp_path, names, "sabotaged")
    v = result["verdict"]
    assert v["beyond_bound"] == ["vllm-dp"] and v["planner_within"] is True
    assert v["best_overall"] != "vllm-dp" and v["best_same_weights"] != "vllm-dp"
    assert check.check_outputs(out, names) == []  # a peer beyond its bound is marked only
    assert (
        "Beyond their format's quality bound, left out of the best: vllm-dp."
        in (out / "table.md").read_text()
    )


def test_a_stored_quality_verdict_its_raw_scores_do_not_give_fails_the_check(engine, tmp_path):
    _, out = bench(tmp_path, ["stock", "auto"])
    path = out / "results.json"
    doc = json.loads(path.read_text())
    doc["quality_runs"][2]["perplexity"] *= 1.15  # auto's raw score, its verdict left
    path.write_text(json.dumps(doc))
    problems = check.check_outputs(out)
    assert any(p.startswith("quality: auto within is True, its runs give False") for p in problems)
    assert any(p.startswith("auto: quality beyond its bound") for p in problems)


# -- pure: formats, chunks, token ids, judged rows -----------------------------------------


def test_a_configurations_format_is_its_quantizations_else_its_dtype():
    assert judging.format_of(None, "", "bfloat16") == "bfloat16"
    assert judging.format_of("awq", "AWQ INT4 (group 128)", "bfloat16") == "awq"
    assert judging.format_of("gptq", "GPTQ INT4 (group 128)", "bfloat16") == "gptq"
    w8a8 = "compressed-tensors W8A8 INT8"
    assert judging.format_of("compressed-tensors", w8a8, "bfloat16") == "w8a8"
    assert judging.format_of("compressed-tensors", "compressed-tensors W4A16 INT4", "") == "int4"
    assert set(judging.BOUNDS) >= {"float32", "bfloat16", "w8a8", "awq", "gptq", "int4"}


def test_held_out_ids_are_cut_into_chunks_the_served_length_allows():
    segments = [list(range(600)), [7], list(range(10))]
    chunks = judging.chunks(segments, 512, 4096)
    assert [len(c) for c in chunks] == [256, 256, 88, 10]  # a lone id scores nothing
    assert [len(c) for c in judging.chunks(segments, 100, 4096)][:2] == [99, 99]
    assert sum(len(c) for c in judging.chunks(segments, 512, 300)) == 300
    with pytest.raises(ValueError, match="no chunk"):
        judging.chunks(segments, 2, 4096)


def test_greedy_tokens_come_back_as_token_ids():
    assert judging.token_ids(["token_id:5", "token_id:0"]) == [5, 0]
    with pytest.raises(ValueError, match="not a token id"):
        judging.token_ids(["hello"])


def test_a_configuration_not_measured_or_without_reference_is_never_passed():
    llamacpp = {"config": "llamacpp", "format": "gguf bf16", "perplexity": None, "note": "why"}
    stock = {"config": "stock", "format": "float32", "perplexity": 20.0, "greedy": [1, 2]}
    auto = {"config": "auto", "format": "bfloat16", "perplexity": 20.2, "greedy": [1, 3]}
    judged = {r["config"]: r for r in scored.judged_rows([stock, auto, llamacpp])}
    assert judged["auto"]["within"] is True and judged["auto"]["greedy_agreement"] == 0.5
    assert judged["stock"]["reference"] == 20.0  # stock in float32 is the reference
    assert (
        judged["llamacpp"]["within"] is None and scored.cell(judged["llamacpp"]) == "not measured"
    )
    assert "why" in scored.line(judged["llamacpp"])
    alone = scored.judged_rows([{**auto, "config": "auto"}])[0]
    assert alone["within"] is None and alone["note"].startswith("not judged: no float32")
    assert scored.beyond([*judged.values(), alone]) == set()


def test_the_models_own_held_out_ids_are_read_bounded(tmp_path):
    (tmp_path / "heldout.json").write_text(json.dumps([[1, 2, 3], [4, 5]]))
    assert quality.heldout(tmp_path, "http://nowhere", "/model") == (
        [[1, 2, 3], [4, 5]],
        "heldout.json",
    )
    (tmp_path / "heldout.json").write_text(json.dumps([[1, -2]]))
    with pytest.raises(gate.InputError, match="fix or remove"):
        quality.heldout(tmp_path, "http://nowhere", "/model")
    (tmp_path / "heldout.json").write_text("[" * 10 + " " * gate.SMALL)
    with pytest.raises(gate.InputError):
        quality.heldout(tmp_path, "http://nowhere", "/model")
    assert sum(len(p.split()) for p in quality.shipped_text()) > 1000  # package data


def test_a_speed_only_run_scores_nothing_and_checks_clean(engine, tmp_path):
    """--no-quality (Settings.quality False): no reference started, no quality rows."""
    configs, _ = layouts.resolve(["stock", "auto"], HOST, TINY, 8401, 512)
    settings = Settings(
        model_dir=tmp_path, model_name="tiny", images={"vllm-openai": "v"},
        workload=workloads.QUICK, max_model_len=512, out_dir=tmp_path / "out", quality=False,
    )  # fmt: skip
    result, status = runner.run_bench(kinds.GENERATION_KIND, configs, settings)
    assert status == 0, result["meta"]["failures"]
    assert not any("reference" in " ".join(c) for c in engine.calls if c[0] == "run")
    assert result["quality_runs"] == [] and result["quality"] == []
    assert not (tmp_path / "out" / "quality.csv").exists()
    assert check.check_outputs(tmp_path / "out") == []
