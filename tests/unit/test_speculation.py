"""Speculative decoding: the planner's choice follows the recorded run, reaches the
container's command, and is refused where it was not measured or cannot apply."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zenvllm.core import gate, request, speculation
from zenvllm.core.container import container_of
from zenvllm.core.errors import PlanError
from zenvllm.core.flavors import synthetic_host
from zenvllm.core.model import model_of_size
from zenvllm.core.plan import Policy, make_plan
from zenvllm.core.request import Request

RUN = Path(__file__).resolve().parents[2] / speculation.EVIDENCE


def recorded() -> dict[str, list[float]]:
    """The recorded run's table: method -> batch-1 TPOT copies, fresh; x4 tok/s copies, fresh."""
    rows = {}
    for line in RUN.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 6 and re.fullmatch(r"[\d.]+", cells[1]):
            rows[cells[0]] = [float(c) for c in cells[1:5]]
    return rows


def test_the_choice_follows_the_recorded_run():
    """What core/speculation.py says of the run holds in it: n-gram pays at batch 1 on
    both workloads and at 4 at once only where the answer copies, a draft model never;
    so auto (a server shared by many) leaves it off and ngram is the one offered."""
    run = recorded()
    none, ngram, draft = run["none"], run[f"ngram k={speculation.NGRAM_TOKENS}"], run["draft k=3"]
    assert ngram[0] < 0.6 * none[0] and ngram[1] < 0.6 * none[1]  # batch-1 TPOT
    assert ngram[2] > none[2] and ngram[3] < none[3]  # x4: gains copying, loses fresh
    assert all(d > n for d, n in zip(draft[:2], none[:2], strict=True))  # slower TPOT
    assert all(d < n for d, n in zip(draft[2:], none[2:], strict=True))  # fewer tok/s
    assert "yes" in RUN.read_text().split("| none |")[1].splitlines()[0]  # greedy equal
    assert speculation.CHOICES == ("auto", "off", "ngram")  # no draft: it lost
    auto = speculation.decide("auto", "generate", split=False)
    assert auto.serve_args() == () and "lost 31%" in auto.why and speculation.EVIDENCE in auto.why


def test_ngram_reaches_the_command_as_vllms_flag():
    host = synthetic_host("epyc-9454-24c-96g")
    plan = make_plan(host, model_of_size(4), Policy(speculation="ngram"))
    assert any("n-gram prompt lookup, 4 tokens" in n for n in plan.notes)
    c = container_of(plan.instances[0], Request(speculation="ngram", supervisor="systemd"))
    (flag,) = [a for a in c.command if a.startswith("--speculative-config=")]
    assert json.loads(flag.split("=", 1)[1]) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    auto = container_of(plan.instances[0], Request(supervisor="systemd"))
    assert not any(a.startswith("--speculative-config") for a in auto.command)


def test_where_it_cannot_apply_it_is_refused_with_the_way_out():
    with pytest.raises(PlanError, match="'pooling', which generates none: give speculation"):
        speculation.decide("ngram", "pooling", split=False)
    with pytest.raises(PlanError, match=r"whole copies only.*give speculation auto"):
        speculation.decide("ngram", "generate", split=True)
    assert speculation.decide("auto", "pooling", split=True).why == ""  # nothing to say
    with pytest.raises(PlanError, match="'draft' is not one of auto, off, ngram"):
        speculation.decide("draft", "generate", split=False)


def test_a_request_that_sets_it_twice_is_refused():
    given = {"speculation": "ngram", "serve_args": ['--speculative-config={"method":"ngram"}']}
    with pytest.raises(gate.InputError, match="speculation ngram and serve_args' --speculative"):
        request.from_json(json.dumps(given))
    with pytest.raises(gate.InputError, match="speculation"):
        request.from_json(json.dumps({"speculation": "eagle"}))
    assert request.from_json(json.dumps({"speculation": "off"})).speculation == "off"
