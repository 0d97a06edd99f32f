"""Every role's variables are written once, in Python (deploy/role_*.py), and its
`defaults/main.yml` and `meta/argument_specs.yml` are made from them (reference.py);
these read the made files back as Ansible reads them."""

from __future__ import annotations

import pytest
import yaml

from zenvllm import reference
from zenvllm.deploy.role_vars import Role

ROLES = {role.name: role for role in reference.ALL}


def test_every_role_of_the_collection_has_its_variables_in_python():
    assert sorted(p.name for p in reference.ROLES.iterdir()) == sorted(ROLES)


@pytest.mark.parametrize("name", sorted(ROLES))
def test_the_defaults_read_back_as_each_variables_value(name):
    role: Role = ROLES[name]
    defaults = yaml.safe_load(reference.defaults_yml(role))
    assert defaults == {role.prefix + var.name: var.value for var in role.variables}
    assert list(defaults) == [role.prefix + var.name for var in role.variables]


@pytest.mark.parametrize("name", sorted(ROLES))
def test_each_argument_spec_is_typed_described_and_defaulted_as_the_defaults(name):
    role: Role = ROLES[name]
    options = yaml.safe_load(reference.argument_specs_yml(role))["argument_specs"]["main"][
        "options"
    ]
    for var in role.variables:
        spec = options[role.prefix + var.name]
        assert spec["type"] in {"str", "int", "float", "bool", "list", "dict", "path", "raw"}
        assert len(spec["description"]) > 20, var.name
        jinja = isinstance(var.value, str) and "{{" in var.value
        assert ("default" not in spec) if jinja else (spec["default"] == var.value), var.name
        assert spec.get("elements", "str") == (var.elements or "str")
        assert spec.get("no_log", False) is var.secret


@pytest.mark.parametrize(
    "value",
    [
        "{{ a\n   | b }}",  # lines after the first indented: folded at its lines
        "{{ a\nb }}",  # a line not indented would fold into a space: quoted instead
        "{{ " + "x | y " * 30 + "}}",  # long: folded at spaces
        "{{ a  b " + "x " * 60 + "}}",  # two spaces would not survive folding: quoted
        ["a", "b"],
        {"k.l": 1},
        [],
        "",
    ],
)
def test_a_value_is_written_as_yaml_that_reads_back_as_itself(value):
    text = reference.yaml_value("key", value)
    assert yaml.safe_load(text) == {"key": value}
    assert max(len(line) for line in text.splitlines()) <= 160  # yamllint's limit here
