"""The order a bench measures in, and whether two runs agree (issue 66's measurements a
model can be checked against): the rounds of a run in rounds, the ratio's spread
over paired repeats, and the agreement check between two runs, passed and failed. The
runner's own order is tested in test_bench_kinds.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from test_bench_kinds import HOST, TINY
from test_bench_predicted import written

from zenvllm.bench import agreement, check, kinds, layouts, order, results, roofline
from zenvllm.bench.results import Run

REPO = Path(__file__).resolve().parents[2]


def names_of(rounds: list[list[order.Visit]], names: list[str]) -> list[list[str]]:
    return [[names[v.index] for v in visits] for visits in rounds]


def test_blocks_measure_every_repeat_at_one_start_in_the_given_or_reversed_order():
    (only,) = order.visits(3, 2, order.Order())
    assert [(v.index, v.repeats, v.last) for v in only] == [
        (0, (1, 2), True),
        (1, (1, 2), True),
        (2, (1, 2), True),
    ]
    (backwards,) = order.visits(3, 2, order.Order(reverse=True))
    assert [v.index for v in backwards] == [2, 1, 0]


def test_rounds_reverse_the_order_each_round_and_the_last_is_each_ones_last_visit():
    names = ["stock", "auto", "single"]
    rounds = order.visits(3, 4, order.Order(order.ROUNDS))
    assert names_of(rounds, names) == [names, names[::-1], names, names[::-1]]
    assert [v.repeats for v in rounds[2]] == [(3,)] * 3
    assert [v.last for r in rounds for v in r] == [False] * 9 + [True] * 3
    backwards = order.visits(3, 4, order.Order(order.ROUNDS, reverse=True))
    assert names_of(backwards, names)[0] == names[::-1]
    assert order.recorded(names, rounds, order.ROUNDS) == {
        "mode": "rounds",
        "rounds": names_of(rounds, names),
    }


def runs(config: str, rates: list[float]) -> list[Run]:
    figures = dict(clients=1, completed=10, failed=0, input_tokens=100, window_s=10.0)
    figures |= dict(request_s=1.0, mean_ttft_ms=10.0, median_ttft_ms=10.0, load_1m=0.1)
    figures |= dict(mean_tpot_ms=10.0, median_tpot_ms=10.0)
    return [
        Run(config, i, output_tokens=int(10 * r), output_tok_s=r, total_tok_s=r + 10, **figures)
        for i, r in enumerate(rates, 1)
    ]


def test_the_ratios_spread_pairs_each_repeat_with_stocks_of_the_same_number():
    configs, _ = layouts.resolve(["stock", "auto"], HOST, TINY, 8401, 512)
    # The machine slows by a quarter over the run: each ratio is 2 in its round, while
    # the medians' ratio, and a spread of unpaired extremes, would not say so.
    measured = runs("stock", [100, 90, 75]) + runs("auto", [200, 180, 150])
    paired = order.with_spread(results.summarize(measured, configs), measured)
    auto = {s.config: s for s in paired}["auto"]
    assert (auto.ratio, auto.ratio_min, auto.ratio_max) == (2.0, 2.0, 2.0)
    unpaired = {s.config: s for s in results.summarize(measured, configs)}["auto"]
    assert unpaired.ratio_min is None  # a document written before runs recorded an order
    noisy = runs("stock", [100, 100, 100]) + runs("auto", [190, 200, 215])
    auto = {s.config: s for s in order.with_spread(results.summarize(noisy, configs), noisy)}[
        "auto"
    ]
    assert (auto.ratio, auto.ratio_min, auto.ratio_max) == (2.0, 1.9, 2.15)


def doc(ratios: dict[str, tuple[float, float, float]], **workload: object) -> dict:
    summary = [{"config": "stock", "ratio": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}]
    summary += [
        {"config": n, "ratio": r, "ratio_min": lo, "ratio_max": hi}
        for n, (r, lo, hi) in ratios.items()
    ]
    w = {"input_len": 128, "output_len": 128, "num_prompts": 48, "concurrency": 16}
    return {"meta": {"kind": "generation", "workload": w | workload}, "summary": summary}


def test_two_runs_agree_when_each_ratio_lies_in_the_others_spread():
    first = doc({"auto": (1.72, 1.70, 1.75), "single": (0.90, 0.88, 0.93)})
    second = doc({"auto": (1.74, 1.71, 1.78), "single": (0.91, 0.89, 0.92)})
    assert agreement.disagreements(first, second) == []
    assert "auto 1.720x and 1.740x" in agreement.agreement_line(first, second)


def test_a_ratio_outside_the_other_runs_spread_fails_either_way():
    first = doc({"auto": (1.72, 1.70, 1.75)})
    drifted = doc({"auto": (1.60, 1.55, 1.74)})  # its ratio under the first's spread
    (said,) = agreement.disagreements(first, drifted)
    assert said.startswith("auto: the second run's ratio to stock 1.600x is outside")
    assert said.endswith("the other run's spread 1.700-1.750")
    assert len(agreement.disagreements(drifted, first)) == 1


@pytest.mark.parametrize(
    "other, says",
    [
        (doc({"single": (1.0, 1.0, 1.0)}), "different configurations"),
        (doc({"auto": (1.72, 1.70, 1.75)}, concurrency=32), "differ in concurrency: 16 and 32"),
        (doc({"auto": (1.72, None, None)}), "no spread of the ratio for auto"),
    ],
)
def test_runs_that_do_not_measure_the_same_thing_are_not_compared(other, says):
    found = agreement.disagreements(doc({"auto": (1.72, 1.70, 1.75)}), other)
    assert found and says in found[0]


def test_check_agrees_with_names_the_other_run_and_fails_a_run_outside_its_spread(tmp_path, capsys):
    """The command as an operator runs it, on a recorded run (written before runs
    recorded their order: refused, saying so) and on two documents made from its raw
    runs, the second's auto repeats 5% faster (within the performance model's bound, so
    each passes the check alone): they agree with themselves, not with each other."""
    recorded = REPO / "docs" / "bench" / "qwen0.5b-predicted"
    assert check.main([str(recorded), "--agrees-with", str(recorded)]) == 1
    assert "no spread of the ratio" in capsys.readouterr().out
    result = json.loads((recorded / "results.json").read_text())
    result["meta"]["order"] = {"mode": "blocks", "rounds": [["stock", "auto"]]}
    first, second = tmp_path / "first", tmp_path / "second"
    for out, faster in ((first, 1.0), (second, 1.05)):
        mine = copy.deepcopy(result)
        for r in mine["runs"]:
            if r["config"] == "auto":
                r["window_s"] = round(r["window_s"] / faster, 4)
                r["output_tok_s"] = round(r["output_tokens"] / r["window_s"], 2)
                r["total_tok_s"] = round(
                    (r["input_tokens"] + r["output_tokens"]) / r["window_s"], 2
                )
                r["request_s"] = round(r["completed"] / r["window_s"], 3)
        assert check.check_outputs(written(mine, out)) == [], out
    assert check.main([str(first), "--agrees-with", str(first)]) == 0
    assert "the runs agree" in capsys.readouterr().out
    assert check.main([str(first), "--agrees-with", str(second)]) == 1
    assert "outside the other run's spread" in capsys.readouterr().out


def test_the_recorded_runs_in_both_orders_agree_on_the_planner_and_not_on_two_per_node():
    """docs/bench/qwen0.5b-rounds and -reversed (the 2-core Zen 5, in rounds, the second
    reversed): each is complete and consistent and its planner within the performance
    model's bound; the planner's ratio lies in the other run's spread both ways, two
    1-core instances' does not (the first run's first round measured cold compile caches:
    docs/benchmarks.md)."""
    first = json.loads((REPO / "docs/bench/qwen0.5b-rounds/results.json").read_text())
    second = json.loads((REPO / "docs/bench/qwen0.5b-rounds-reversed/results.json").read_text())
    for name in ("qwen0.5b-rounds", "qwen0.5b-rounds-reversed"):
        assert check.check_outputs(REPO / "docs" / "bench" / name) == [], name
    assert first["meta"]["order"]["rounds"][0] == second["meta"]["order"]["rounds"][0][::-1]
    found = agreement.disagreements(first, second)
    assert found == [
        "two-per-node: the second run's ratio to stock 1.363x is outside the other run's "
        "spread 1.223-1.309"
    ]


def test_a_run_whose_bandwidth_figure_was_half_fails_the_check_and_holds_with_the_real_one():
    """docs/bench/qwen1.5b-low-bandwidth (the 1.5 B shape on the same Zen 5, right after
    the reversed run): the bench measured 14.56 GB/s per core busy at its start, half the
    first run's 29.79; decode then streamed more than that figure allows and the planner
    made 19% more than predicted, so the check fails the run naming both. Derived again
    with the first run's figure (measured 35 minutes before on the machine), every
    prediction is within the model's bound and no share is over 100%."""
    run = REPO / "docs" / "bench" / "qwen1.5b-low-bandwidth"
    found = check.check_outputs(run)
    assert any(p.startswith("roofline: auto at batch 1 streamed") for p in found), found
    assert any(p.startswith("auto: predicted 70.4 output tok/s") for p in found), found
    doc = json.loads((run / "results.json").read_text())
    first = json.loads((REPO / "docs/bench/qwen0.5b-rounds/results.json").read_text())["meta"]
    for key in ("core_bandwidth_gbs", "core_alone_gbs"):
        doc["meta"][key] = first[key]
    derived = kinds.of_document(doc).derive(doc)
    assert [r["within"] for r in derived["predictions"]] == [True, True, True]
    assert not any(roofline.over(r.get("batch1_percent")) for r in derived["roofline"])
    assert not any(roofline.over(r.get("percent")) for r in derived["roofline"])


def test_the_15b_run_in_rounds_is_predicted_within_20_percent_and_streams_over_its_figure():
    """docs/bench/qwen1.5b-rounds (the 1.5 B shape on the Zen 5 VM, stock, auto and
    two-per-node in two rounds, the figure measured again at the end within 10% of the
    start's): every configuration's output tok/s within 20% of its prediction (the
    issue's bound; two-per-node at 17.8%, inside the model's own 18% too); but at batch 1
    auto read its weights at 106.7% of the copy's figure, so bench.check fails the run on
    the roofline alone: memmove's figure (read and written) is a low ceiling for a decode
    step's reads."""
    run = REPO / "docs" / "bench" / "qwen1.5b-rounds"
    doc = json.loads((run / "results.json").read_text())
    assert doc["meta"]["order"]["mode"] == "rounds"
    start, end = doc["meta"]["core_bandwidth_gbs"], doc["meta"]["bandwidth_end_gbs"]
    assert abs(end / start - 1) <= 0.10, (start, end)
    rows = kinds.of_document(doc).derive(doc)["predictions"]
    errors = {r["config"]: r["predicted_output_tok_s"] / r["output_tok_s"] - 1 for r in rows}
    assert set(errors) == {"stock", "auto", "two-per-node"}
    assert all(abs(e) <= 0.20 for e in errors.values()), errors
    found = check.check_outputs(run)
    assert [p.split(" streamed")[0] for p in found] == ["roofline: auto at batch 1"], found
