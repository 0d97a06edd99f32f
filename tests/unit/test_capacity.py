"""Sizing a load (core/capacity.py, `zenvllm plan --load --slo`): a target met on one
host with its headroom, missed (so many hosts of the kind), refused when no number of
hosts meets it; the hosts' arithmetic; bad values refused by argparse and the gate."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import replace

import pytest
from support import readme
from support.cli import refused, zenvllm

from zenvllm.core import capacity, performance
from zenvllm.core.errors import PlanError
from zenvllm.core.flavors import synthetic_host
from zenvllm.core.model import Model, model_of_size
from zenvllm.core.performance import parse_load, parse_slo
from zenvllm.core.plan import Policy, layout_of, machine_of, make_plan

FLAVOR = "vcpus=24,ram_gib=96"  # the acceptance's: 24 cores of a Genoa, no SMT
SIXTEEN = model_of_size(16)


def sized(load: str, slo: str = "", flavor: str = FLAVOR, model: Model = SIXTEEN, **policy):
    asked = Policy(load=parse_load(load), slo=parse_slo(slo) if slo else None, **policy)
    plan = make_plan(synthetic_host(flavor), model, asked)
    return plan, capacity.size(plan)


def alone(plan, load: str):
    """TPOT and TTFT of one request alone on the plan's smallest instance."""
    machine, shape = (
        machine_of(plan.host, plan.model, plan.policy),
        performance.shape_of(plan.model),
    )
    return performance.predict(shape, machine, layout_of(plan.instances), parse_load(load), 1)


def test_a_load_this_host_meets_is_said_with_its_headroom():
    _, sized_ = sized("concurrency=3,in=1000,out=300", "tpot_ms=250")
    assert sized_.hosts == 1 and sized_.batch == 4 and sized_.per_host == 4
    assert sized_.fleet.tpot_ms <= 250 and sized_.fleet.batch == 3
    assert "this host meets the load: 3 clients of its 4" in sized_.lines[-1]
    assert "headroom 33%" in sized_.lines[-1]
    assert "one more would miss it (TPOT" in sized_.limit


def test_a_load_one_host_misses_needs_that_many_hosts():
    _, sized_ = sized("concurrency=200,in=1000,out=300", "tpot_ms=250")
    assert sized_.hosts == math.ceil(200 / sized_.per_host) == 50
    assert sized_.fleet.batch == 4 and sized_.fleet.tpot_ms <= 250
    # The fleet's output is every host's: 50 of this host's share.
    one = sized("concurrency=4,in=1000,out=300", "tpot_ms=250")[1]
    assert sized_.fleet.output_tok_s == pytest.approx(50 * one.fleet.output_tok_s)
    assert "needs 50 hosts of this kind (200 clients / 4 per host" in sized_.lines[-1]


def test_a_target_no_number_of_hosts_meets_is_refused_with_the_least_they_give():
    load = "concurrency=200,in=1000,out=300"
    plan = make_plan(synthetic_host(FLAVOR), SIXTEEN, Policy(load=parse_load(load)))
    least = alone(plan, load)
    with pytest.raises(PlanError) as no:
        sized(load, "tpot_ms=150")
    said = str(no.value)
    assert said.startswith("--slo tpot_ms=150: no number of hosts of this kind")
    assert f"TPOT {least.tpot_ms:,.0f} ms" in said and "a flavor with more cores" in said
    assert f"a target of at least TPOT {least.tpot_ms:,.0f} ms" in said
    with pytest.raises(PlanError, match=r"TTFT .* against ttft_ms=500"):
        sized(load, "ttft_ms=500")  # 1000 tokens of prefill alone take longer


def test_each_target_limits_the_batch():
    by_tpot = sized("concurrency=8,in=1000,out=300", "tpot_ms=250")[1].batch
    by_reading = sized("concurrency=8,in=1000,out=300", "user_tok_s=4")[1].batch  # <= 250 ms
    assert by_reading == by_tpot
    by_ttft = sized("concurrency=8,in=1000,out=300", "ttft_ms=2880")[1]
    assert by_ttft.batch < by_tpot and "ttft_ms=2880" in by_ttft.limit


def test_without_a_target_the_scheduler_or_the_kv_cache_limits_the_batch():
    plan, free = sized("concurrency=600,in=1000,out=300")
    assert free.batch == plan.policy.max_num_seqs == 256 and free.hosts == 3
    assert "KV bytes per token are unknown" in free.limit
    # A model whose K and V are known: the cache holds so many requests of 5,000 tokens.
    known = replace(model_of_size(16), kv_bytes_per_token=131_072)  # a Llama-3-8B's
    plan, kv = sized("concurrency=600,in=4000,out=1000", model=known)
    held = plan.instances[0].kv_cache_gib * 1024**3 // (131_072 * 5000)
    assert kv.batch == held < 256 and "the KV cache, which holds" in kv.limit
    assert kv.hosts == math.ceil(600 / held)


def test_instances_of_a_host_add_up_and_a_pipeline_takes_groups_of_hosts():
    two = sized(
        "concurrency=100,in=500,out=200", "tpot_ms=300", flavor="vcpus=48,ram_gib=192,numa=2"
    )
    plan, capacity_ = two
    assert len(plan.instances) == 2
    assert capacity_.per_host == 2 * capacity_.batch
    assert capacity_.hosts == math.ceil(100 / capacity_.per_host)
    plan, piped = sized(
        "concurrency=10,in=500,out=200",
        flavor="epyc-9454-24c-96g",
        model=model_of_size(140),
        hosts=2,
    )
    assert layout_of(plan.instances).stages == 2
    assert piped.hosts % 2 == 0 and "group of 2 hosts" in piped.lines[2]


def test_a_rate_is_served_by_enough_hosts_at_the_batch_the_target_allows():
    plan, by_rate = sized("rate=0.5,in=1000,out=300", "tpot_ms=250")
    at = performance.predict(
        performance.shape_of(plan.model),
        machine_of(plan.host, plan.model, plan.policy),
        layout_of(plan.instances),
        parse_load("rate=0.5,in=1000,out=300"),
        by_rate.batch,
    )
    per_host = by_rate.batch / ((at.ttft_ms + 300 * at.tpot_ms) / 1000)
    assert by_rate.per_host == pytest.approx(per_host)
    assert by_rate.hosts == math.ceil(0.5 / per_host)
    assert by_rate.fleet.batch <= by_rate.batch and by_rate.fleet.tpot_ms <= 250
    assert by_rate.fleet.output_tok_s == pytest.approx(0.5 * 300)


def test_requests_longer_than_the_plan_serves_are_refused():
    with pytest.raises(PlanError, match="over the 512 this plan serves"):
        sized("concurrency=2,in=500,out=100", max_model_len=512)


def test_the_plan_explains_its_prediction_and_where_its_figures_come_from():
    plan = make_plan(synthetic_host(FLAVOR), SIXTEEN)
    note = next(n for n in plan.notes if n.startswith("predicted by core/performance.py"))
    assert "one request alone gets a token every" in note and "output tok/s" in note
    assert "4 GB/s per core (a spec-sheet default" in note  # the bandwidth's source
    assert "fitted on docs/bench/qwen0.5b-split" in note  # the compute's
    pooled = replace(model_of_size(1), runner="pooling")
    assert not any(
        n.startswith("predicted") for n in make_plan(synthetic_host(FLAVOR), pooled).notes
    )


# -- as the operator types it

ACCEPTANCE = (
    "--flavor",
    FLAVOR,
    "--model-size-gib",
    "16",
    "--load",
    "concurrency=200,in=1000,out=300",
)


def test_the_acceptance_command_prints_the_hosts_their_layout_and_why():
    done = zenvllm("plan", *ACCEPTANCE, "--slo", "tpot_ms=250")
    assert done.returncode == 0, done.stderr
    assert "zenvllm-0     8001" in done.stdout  # each host's layout
    assert "capacity: 50 host(s) of this kind" in done.stdout
    assert "the load needs 50 hosts of this kind" in done.stdout
    doc = json.loads(zenvllm("plan", *ACCEPTANCE, "--slo", "tpot_ms=250", "--json").stdout)
    assert doc["capacity"]["hosts"] == 50 and doc["capacity"]["slo"] == "tpot_ms=250"
    assert doc["capacity"]["why"][-1].startswith("the load needs 50 hosts")


def test_an_slo_no_host_meets_exits_2_naming_the_target_the_least_and_the_fix():
    refused(
        zenvllm("plan", *ACCEPTANCE, "--slo", "tpot_ms=150"),
        "--slo tpot_ms=150: no number of hosts",
        "one request alone on an instance of 23 core(s) gets TPOT",
        "or a target of at least TPOT",
    )


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        (
            "--load",
            "concurrency=-1,in=1000,out=300",
            "argument --load: concurrency is -1, not a whole number from 1 to 1,000,000; "
            "e.g. concurrency=200",
        ),
        (
            "--load",
            "foo=1",
            "argument --load: 'foo=1' is not one of concurrency=, rate=, in=, out=; e.g.",
        ),
        (
            "--slo",
            "tpot_ms=abc",
            "argument --slo: tpot_ms is 'abc', not a number in (0, 3,600,000]; e.g.",
        ),
    ],
)
def test_a_bad_value_exits_2_naming_the_value_the_limit_and_the_fix(flag, value, says):
    refused(zenvllm("plan", "--flavor", FLAVOR, "--model-size-gib", "16", flag, value), says)


def test_the_request_gate_refuses_the_same_values_and_an_slo_without_a_load():
    base = ("plan", "--flavor", FLAVOR, "--model-size-gib", "16", "--request")
    refused(
        zenvllm(*base, '{"load": "concurrency=0,in=1,out=1"}'),
        "--request: load: concurrency is 0, not a whole number from 1 to 1,000,000",
    )
    refused(
        zenvllm(*base, '{"slo": "tpot_ms=250"}'), "is met or missed at a load", "give load (--load)"
    )


def test_the_sizing_how_to_runs_as_written_and_shows_what_it_prints():
    argv = shlex.split(readme.written("plan-sizing"))
    assert argv[:2] == ["zenvllm", "plan"]
    done = zenvllm(*argv[1:])
    assert done.returncode == 0, done.stderr
    page = (readme.ROOT / "docs" / "how-to" / "plan-a-host.md").read_text()
    shown = page.split("<!-- tested: plan-sizing -->", 1)[1].split("```", 4)[3]
    assert shown.startswith("text\n")
    for line in shown.removeprefix("text\n").strip().splitlines():
        if line != "...":
            assert line in done.stdout, line
    # The page's anchor: the blog's flavor and Qwen3-8B at 4 clients, at the spec sheet's figure.
    plan, _ = sized(
        "concurrency=4,in=128,out=128", flavor="epyc-9454-24c-96g", model=model_of_size(15.3)
    )
    note = next(n for n in plan.notes if n.startswith("predicted"))
    assert "TPOT 401 ms" in note and "the model at 4 GB/s per core says 401" in " ".join(
        page.split()
    )
