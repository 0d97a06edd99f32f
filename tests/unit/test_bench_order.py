"""The order a bench measures in, and whether two runs agree (issue 66's measurements a
model can be checked against): the rounds of a run in rounds, the ratio's spread
over paired repeats, and the agreement check between two runs, passed and failed. The
runner's own order is tested in test_bench_kinds.py."""

from __future__ import annotations

import copy
import itertools
import json
import math
import statistics
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


def doc(rates: dict[str, list[float]], **workload: object) -> dict:
    """A run's document as agreement reads it: its raw repeats (output tok/s, stock's
    among them) and the summary's ratios and spreads they give."""
    stock = rates.get("stock", [100.0] * len(next(iter(rates.values()))))
    measured = [{"config": "stock", "repeat": i, "output_tok_s": r} for i, r in enumerate(stock, 1)]
    summary = [{"config": "stock", "ratio": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}]
    for name, figures in rates.items():
        if name == "stock":
            continue
        ratios = [r / s for r, s in zip(figures, stock, strict=True)]
        measured += [
            {"config": name, "repeat": i, "output_tok_s": r} for i, r in enumerate(figures, 1)
        ]
        summary.append(
            {
                "config": name,
                "ratio": round(statistics.median(ratios), 3),
                "ratio_min": round(min(ratios), 3),
                "ratio_max": round(max(ratios), 3),
            }
        )
    w = {"input_len": 128, "output_len": 128, "num_prompts": 48, "concurrency": 16}
    meta = {"kind": "generation", "workload": w | workload}
    return {"meta": meta, "summary": summary, "runs": measured}


def test_two_runs_agree_when_their_repeats_mix():
    first = doc({"auto": [172, 170, 175], "single": [90, 88, 93]})
    second = doc({"auto": [174, 171, 178], "single": [91, 89, 92]})
    assert agreement.disagreements(first, second) == []
    line = agreement.agreement_line(first, second)
    assert "auto 1.720x and 1.740x (p 0.70)" in line and "single 0.900x" in line


def test_a_median_outside_the_other_runs_spread_is_noise_when_the_repeats_mix():
    """The old criterion (each median within the other's lowest and highest) fails these:
    the second's median 1.76x is above the first's 1.70-1.75. Their repeats interleave
    (1.70 1.71 1.72 1.75 1.76 1.80), as 3 in 5 pairs of runs from one distribution do."""
    first, second = doc({"auto": [170, 172, 175]}), doc({"auto": [171, 176, 180]})
    assert agreement.disagreements(first, second) == []
    assert agreement.disagreements(second, first) == []


def test_an_order_that_moves_every_repeat_fails_either_way():
    first = doc({"auto": [172, 170, 175]})
    drifted = doc({"auto": [160, 155, 158]})  # every repeat under the first's
    (said,) = agreement.disagreements(first, drifted)
    assert said.startswith("auto: the order moved its ratio to stock: 1.720x (1.700-1.750)")
    assert "against 1.580x (1.550-1.600); of the 20 deals" in said
    assert "a share of 0.100 sets the runs' repeats as far apart" in said
    assert len(agreement.disagreements(drifted, first)) == 1


def test_at_three_repeats_each_only_runs_wholly_apart_disagree_one_deal_in_ten():
    """Every way six distinct repeats can fall into two runs of three, as they do when
    the order makes no difference: 2 of the 20 disagree (each run's repeats all above the
    other's), so a run alike in both orders fails the check one time in ten."""
    pooled = [170, 171, 172, 175, 176, 180]
    failed = []
    for chosen in itertools.combinations(range(6), 3):
        mine = [pooled[i] for i in chosen]
        theirs = [v for i, v in enumerate(pooled) if i not in chosen]
        if agreement.disagreements(doc({"auto": mine}), doc({"auto": theirs})):
            failed.append(mine)
    assert failed == [[170, 171, 172], [175, 176, 180]]


def test_many_repeats_are_dealt_by_a_fixed_draw_and_judged_alike_each_time():
    mine = [1.0 + i / 100 for i in range(10)]
    mixed = [v + 0.005 for v in mine]  # each between two of mine: alike
    assert math.comb(20, 10) > agreement.EXACT_DEALS
    first = agreement.order_p(mine, mixed)
    assert first == agreement.order_p(mine, mixed) and first[1] == math.comb(20, 10)
    assert first[0] > 0.5
    apart = agreement.order_p(mine, [v + 0.5 for v in mine])[0]
    assert apart < 0.001  # 2 of 184,756 deals, drawn 50,000 times


@pytest.mark.parametrize(
    "other, says",
    [
        (doc({"single": [100, 100, 100]}), "different configurations"),
        (doc({"auto": [172, 170, 175]}, concurrency=32), "differ in concurrency: 16 and 32"),
        (doc({"auto": [172, 170]}), "auto: 3 and 2 repeats cannot show an order"),
    ],
)
def test_runs_that_cannot_be_compared_are_not(other, says):
    found = agreement.disagreements(doc({"auto": [172, 170, 175]}), other)
    assert found and says in found[0]


def test_a_run_recorded_before_runs_kept_their_order_is_refused_saying_so():
    unpaired = doc({"auto": [172, 170, 175]})
    unpaired["summary"][1] |= {"ratio_min": None, "ratio_max": None}
    (found,) = agreement.disagreements(doc({"auto": [172, 170, 175]}), unpaired)
    assert "no spread of the ratio for auto" in found


ZEN4 = REPO / "docs" / "test-runs" / "2026-12-06-zen4-rounds"


def test_check_agrees_with_names_the_other_run_and_fails_an_order_that_moved_a_ratio(
    tmp_path, capsys
):
    """The command as an operator runs it, on a recorded run with one repeat (refused,
    saying so) and on two documents made from the reversed Zen 4 run's raw runs, the
    second's two 1-core instances 15% faster in every round (reported by the performance
    model, not failed: it fails only the planner's layout), so each passes the check
    alone: they agree with themselves, not with each other."""
    one = REPO / "docs" / "bench" / "qwen0.5b-predicted"
    assert check.main([str(one), "--agrees-with", str(one)]) == 1
    assert "no spread of the ratio" in capsys.readouterr().out
    result = json.loads((ZEN4.with_name(ZEN4.name + "-reversed") / "results.json").read_text())
    first, second = tmp_path / "first", tmp_path / "second"
    for out, faster in ((first, 1.0), (second, 1.15)):
        mine = copy.deepcopy(result)
        for r in mine["runs"]:
            if r["config"] == "two-per-node":
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
    said = capsys.readouterr().out
    assert "two-per-node: the order moved its ratio to stock" in said
    assert "auto:" not in said


@pytest.mark.parametrize(
    "first, reversed_",
    [
        ("bench/qwen0.5b-rounds", "bench/qwen0.5b-rounds-reversed"),  # the 2-core Zen 5
        ("test-runs/2026-12-06-zen4-rounds", "test-runs/2026-12-06-zen4-rounds-reversed"),
    ],
)
def test_the_recorded_runs_in_both_orders_agree_and_an_order_effect_would_not(first, reversed_):
    """Two runs in rounds, the second reversed, on the 2-core Zen 5 (family 26 model 2;
    its first round on cold compile caches) and on the 2-core Zen 4 (family 25 model 17;
    the caches warmed by a run before): each complete and consistent, and no ratio moved
    by the order beyond its repeats' noise, though two 1-core instances' median lies
    outside the other run's spread on each machine (1.363x against 1.223-1.309; 1.612x
    against 1.445-1.590). Their repeats 20% faster in the reversed run, as the issue saw an
    order move vLLM's data parallel (187.2 output tok/s in fourth place, 155.3 in
    second), and the check names them; three repeats do not see much less on these VMs
    (the Zen 4's first run measured them from 1.110x to 1.713x)."""
    a = json.loads((REPO / "docs" / first / "results.json").read_text())
    b = json.loads((REPO / "docs" / reversed_ / "results.json").read_text())
    for run in (first, reversed_):
        assert check.check_outputs(REPO / "docs" / run) == [], run
    assert a["meta"]["order"]["rounds"][0] == b["meta"]["order"]["rounds"][0][::-1]
    assert agreement.disagreements(a, b) == [] == agreement.disagreements(b, a)
    ours, theirs = agreement.by_config(a)["two-per-node"], agreement.by_config(b)["two-per-node"]
    outside = not theirs["ratio_min"] <= ours["ratio"] <= theirs["ratio_max"] or not (
        ours["ratio_min"] <= theirs["ratio"] <= ours["ratio_max"]
    )
    assert outside  # the old criterion's failure: noise, as the deals say
    favoured = copy.deepcopy(b)
    for r in favoured["runs"]:
        if r["config"] == "two-per-node":
            r["output_tok_s"] *= 1.2
    (said,) = agreement.disagreements(a, favoured)
    assert said.startswith("two-per-node: the order moved its ratio to stock")


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
