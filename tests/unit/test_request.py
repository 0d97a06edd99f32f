"""The deployment request (core/request.py): one schema, and every file made from it.

The generated files are checked for staleness, and each is read back the way its user
reads it: the role's defaults by YAML, its request template by Jinja2 with Ansible's
`to_json`, the result by the planner's own `--request` gate, the flags by argparse.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import pytest
import yaml
from support import role_template
from support.cli import zenvllm

from zenvllm import reference
from zenvllm.core import request
from zenvllm.core.errors import UserError
from zenvllm.core.request import DEFAULT, Request
from zenvllm.deploy import role_instances
from zenvllm.deploy.role_instances import ROLE_PREFIX, VARIABLES

ROLE = reference.INSTANCES


def test_every_generated_file_is_what_the_schema_makes():
    done = subprocess.run(
        [sys.executable, "-m", "zenvllm.reference", "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_names_a_stale_file_and_leaves_it(tmp_path):
    stale = tmp_path / "main.yml"
    stale.write_text("zenvllm_instances_base_port: 8002\n")
    made = reference.defaults_yml(role_instances.ROLE)
    assert reference.write_or_compare(stale, made, check=True)
    assert stale.read_text() == "zenvllm_instances_base_port: 8002\n"
    assert not reference.write_or_compare(stale, stale.read_text(), check=True)


def test_each_option_is_a_role_variable_with_its_default_and_spec():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    names = [ROLE_PREFIX + v.name for v in VARIABLES]
    assert list(defaults) == names == list(options)
    # Every option of a request is a role variable, in the request's order.
    assert [v.name for v in VARIABLES if not v.role_only] == [f.name for f in fields(Request)]
    assert defaults[ROLE_PREFIX + "base_port"] == DEFAULT.base_port == 8001
    assert options[ROLE_PREFIX + "target"]["choices"] == ["vllm-openai", "zen", "pace"]
    assert options[ROLE_PREFIX + "api_key"]["no_log"] is True
    # The role deploys zen anywhere, loudly; the CLI refuses unless asked.
    assert defaults[ROLE_PREFIX + "allow_inactive"] is True and DEFAULT.allow_inactive is False


def render_request(overrides: dict) -> str:
    """The role's request.json.j2 rendered by Ansible's own templar over the role's
    defaults (its Jinja defaults resolved as a lone host's inventory would)."""
    overrides = {ROLE_PREFIX + k: v for k, v in overrides.items()}
    return role_template.render(ROLE, "request.json.j2", **overrides)


def test_the_roles_request_passes_the_planners_gate_typed():
    # -e key=value gives strings: the template types them as the schema says.
    text = render_request({"base_port": "8101", "count": "2", "kv_fraction": "0.5"})
    asked = request.from_json(text)
    assert (asked.base_port, asked.instances, asked.kv_fraction) == (8101, 2, 0.5)
    assert asked.serve_args == DEFAULT.serve_args and asked.allow_inactive is True
    assert asked.image == DEFAULT.image and asked.address == "127.0.0.1"  # Jinja defaults
    sent = json.loads(text)
    role_only = {v.name for v in VARIABLES if v.role_only}
    assert list(sent) == [f.name for f in fields(Request)]  # the whole request
    assert not role_only & set(sent)  # no secret, no role knob


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"count": 0}, "count is 0, not a whole number from 1"),
        ({"count": "many"}, 'count is "many", not a whole number'),
        ({"kv_fraction": 0}, "kv_fraction is 0, not a number in (0, 1]"),
        ({"model_size_gib": -1}, "model_size_gib is -1, not a number in [0, 1,048,576]"),
        ({"layout": "spread"}, 'layout is "spread", not one of contiguous, interleaved'),
        ({"deployment": "Site A"}, 'deployment is "Site A", not a name'),
        ({"allow_inactive": "yes"}, 'allow_inactive is "yes", not true or false'),
        ({"hf_token": "x"}, "'hf_token' is not an option of a request"),
        ({"config_dir": "etc"}, 'config_dir is "etc", not an absolute path'),
    ],
)
def test_a_bad_request_is_refused_naming_the_option_and_limit(given, says):
    with pytest.raises(UserError) as refused:
        request.from_json(json.dumps(given))
    assert says in str(refused.value)


def test_zero_means_the_planners_own_choice():
    asked = request.from_json('{"model_size_gib": 0, "kv_cache_gib": 0, "max_model_len": 0}')
    assert asked.model_size_gib == 0.0 and asked.instances is None


def test_the_flags_come_from_the_schema():
    """`zenvllm plan --help` lists each flagged option with its one-line help and
    default; a flag given overrides --request."""
    shown = zenvllm("plan", "--help").stdout
    for name, spec, _ in request.specs():
        if spec.flag:
            assert spec.flag in shown, name
    assert "(default 8001)" in " ".join(shown.split())
    done = zenvllm(
        "plan",
        "--flavor",
        "epyc-9454-24c-96g",
        "--model-size-gib",
        "4",
        "--json",
        "--request",
        '{"base_port": 9000, "deployment": "site-a"}',
        "--base-port",
        "9100",
    )
    assert done.returncode == 0, done.stderr
    instances = json.loads(done.stdout)["instances"]
    assert instances[0]["port"] == 9100 and instances[0]["name"] == "site-a-0"


@pytest.mark.parametrize("role", sorted(p.name for p in reference.ROLES.iterdir()))
def test_each_roles_defaults_and_argument_specs_name_the_same_variables(role):
    """Each role's variables are documented once, in its argument specs (the request's
    for the instances role), and each has its default."""
    path = reference.ROLES / role
    defaults = yaml.safe_load((path / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((path / "meta" / "argument_specs.yml").read_text())
    assert set(defaults) == set(specs["argument_specs"]["main"]["options"])
