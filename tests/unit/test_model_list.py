"""Several models in one deployment request (core/model_list.py, request.several_checked):
the instances role's `models` and `shares` reach the planner as `zenvllm plan`'s flags
do, and every bad entry is refused by value, exit 2, before anything is planned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.tiny_model import ensure_tiny_model
from test_cli_plan import zenvllm

from zenvllm.core import model_list, request
from zenvllm.core.gate import InputError
from zenvllm.core.model_list import Share

ROOT = str(Path(__file__).parents[1] / "fixtures" / "hosts" / "epyc-9354-2s-smt")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("chat=/srv/models/qwen", ("chat", "/srv/models/qwen")),
        ("embed-2=/m", ("embed-2", "/m")),
        ("chat=srv/models", None),  # not absolute
        ("Chat=/m", None),  # not a served name of the rule
        ("chat=/m,/n", None),
        ("=/m", None),
        ("/srv/models/qwen", None),
    ],
)
def test_an_entry_is_name_equals_an_absolute_dir(text, parsed):
    assert model_list.entry(text) == parsed


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("embed=cores:4", Share("embed", cores=4)),
        ("chat=weight:2.5", Share("chat", weight=2.5)),
        ("chat=cores:0", None),
        ("chat=weight:0", None),
        ("chat=weight:nan", None),
        ("chat=weight:inf", None),
        ("chat=cores:9999999", None),
        ("chat=4", None),
        ("Chat=cores:1", None),
    ],
)
def test_a_share_is_cores_or_a_positive_weight(text, parsed):
    assert model_list.share(text) == parsed


def test_the_roles_request_plans_two_models_as_one_document(tmp_path):
    chat = ensure_tiny_model()
    asked = {"deployment": "site", "models": [f"chat={chat}", f"other={chat}"]}
    asked["shares"] = ["other=cores:2"]
    done = zenvllm("plan", "--json", "--root", ROOT, "--request", json.dumps(asked))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [m["served_name"] for m in doc["models"]] == ["chat", "other"]
    names = {i["name"]: i for i in doc["instances"]}
    other = {c for n in doc["models"][1]["instances"] for c in names[n]["cpus"]}
    assert len(other) == 4  # two cores and their SMT siblings
    assert all(i["container"]["served_model_name"] in ("chat", "other") for i in names.values())
    assert "model" not in doc  # several: each is in `models`
    for model in doc["models"]:  # each answers at its own instances' URLs
        assert model["urls"] == [names[n]["container"]["url"] for n in model["instances"]]


def test_one_model_is_listed_in_models_too():
    done = zenvllm("plan", "--json", "--root", ROOT, "--model", str(ensure_tiny_model()))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (only,) = doc["models"]
    assert only["served_name"] == "tiny-llama" and only["name"] == doc["model"]["name"]
    assert only["instances"] == [i["name"] for i in doc["instances"]]
    assert only["urls"] == [i["container"]["url"] for i in doc["instances"]]


@pytest.mark.parametrize(
    ("asked", "says"),
    [
        ({"models": ["chat=relative/dir"]}, "is not NAME=DIR"),
        ({"models": ["a=/m/a", "a=/m/b"]}, "two models are named a"),
        ({"models": ["a=/m/a", "b=/m/b"], "shares": ["c=cores:1"]}, "names c, which no models"),
        ({"models": ["a=/m/a", "b=/m/b"], "shares": ["a=half"]}, "is not NAME=cores:N"),
        ({"models": ["a=/m/a"], "shares": ["a=cores:1"]}, "give two or more NAME=DIR"),
        ({"models": ["a=/m/a", "b=/m/b"], "model_dir": "/m/c"}, "and model_dir is given too"),
        ({"models": ["a=/m/a", "b=/m/b"], "hosts": 2}, "a copy cut over hosts serves one"),
        ({"models": "a=/m/a"}, "models"),  # not a list
    ],
)
def test_a_bad_models_request_is_refused_by_value(asked, says):
    with pytest.raises(InputError) as refused:
        request.from_json(json.dumps(asked))
    assert says in str(refused.value)
    done = zenvllm("plan", "--root", ROOT, "--request", json.dumps(asked))
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
