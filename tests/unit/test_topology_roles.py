"""The fleet's topology (zenvllm/deploy/topology.py) as the roles receive it, and the
roles' promise that they only print it: no role default, vars file or template
computes an index, a port or a unit name."""

from __future__ import annotations

import re

import pytest
from support.ansible_run import ANSIBLE_DIR

from zenvllm.deploy import topology

FLEET = ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize(
    ("host", "hosts", "run", "rank"),
    [
        ("a", 1, ["a"], 0),
        ("c", 1, ["c"], 0),
        ("a", 2, ["a", "b"], 0),
        ("b", 2, ["a", "b"], 1),
        ("d", 2, ["c", "d"], 1),
        ("e", 2, ["e"], 0),  # the last run is short: the planner refuses it by name
        ("f", 2, ["f"], 0),  # not in the zenvllm group
        ("c", 3, ["a", "b", "c"], 2),
        ("d", 3, ["d", "e"], 0),
    ],
)
def test_each_host_finds_its_run_and_its_stage(host, hosts, run, rank):
    assert topology.pipeline_hosts(FLEET, host, hosts) == run
    assert topology.host_rank(run, host) == rank


def test_one_model_keeps_the_routers_plain_unit_on_the_given_ports():
    models = [
        {"served_name": "chat", "urls": ["http://10.0.0.1:8001", "http://10.0.0.1:8002"]},
        {"served_name": "chat", "urls": ["http://10.0.0.2:8001", "http://10.0.0.1:8002"]},
    ]
    (unit,) = topology.router_units(models, "fleet-router", "10.0.0.9:8000", "10.0.0.9:29000")
    assert unit == {
        "served_name": "chat",
        "unit": "fleet-router",
        "unit_file": "fleet-router.service",
        "listen": "10.0.0.9:8000",
        "urls": ["http://10.0.0.9:8000"],
        "metrics_listen": "10.0.0.9:29000",
        "workers": ["http://10.0.0.1:8001", "http://10.0.0.1:8002", "http://10.0.0.2:8001"],
    }


def test_each_model_gets_its_router_on_the_next_ports_in_name_order():
    models = [
        {"served_name": "embed/v1", "urls": ["http://h:8003"]},
        {"served_name": "chat", "urls": ["http://h:8001"]},
    ]
    units = topology.router_units(models, "r", "[fd00::9]:8000", "127.0.0.1:29000")
    assert [(u["unit"], u["listen"], u["metrics_listen"]) for u in units] == [
        ("r-chat", "[fd00::9]:8000", "127.0.0.1:29000"),
        ("r-embed_v1", "[fd00::9]:8001", "127.0.0.1:29001"),
    ]
    assert [u["workers"] for u in units] == [["http://h:8001"], ["http://h:8003"]]


def test_prometheus_scrapes_each_router_hosts_routers():
    assert topology.router_targets(["10.0.0.9", "", "10.0.0.8"], 2) == [
        "10.0.0.9:29000",
        "10.0.0.9:29001",
        "10.0.0.8:29000",
        "10.0.0.8:29001",
    ]
    assert topology.router_targets(["10.0.0.9"], 0) == ["10.0.0.9:29000"]


# What computing an index, a port or a unit name looks like in Jinja.
ARITHMETIC = re.compile(
    r"\.index\(|loop\.index|\|\s*int\s*[-+*]|[-+*]\s*\(?\s*\w+\s*\|\s*int"
    r"|//\s*\w+\s*\*|\brange\(|\bproduct\(|'\$',\s*'\.service'"
)
# Timeouts divided into retries are counts of tries, not topology.
RETRIES = re.compile(r"^\s*retries:")


def role_files():
    for role in sorted((ANSIBLE_DIR / "roles").iterdir()):
        for sub in ("defaults", "vars", "templates"):
            yield from sorted(p for p in (role / sub).rglob("*") if p.is_file())


def computed(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if ARITHMETIC.search(line) and not RETRIES.match(line)
    ]


def test_no_role_computes_an_index_a_port_or_a_unit_name():
    found = {
        str(p.relative_to(ANSIBLE_DIR)): hits
        for p in role_files()
        if (hits := computed(p.read_text()))
    }
    assert found == {}


@pytest.mark.parametrize(
    "line",
    [
        "{{ fleet[fleet.index(inventory_hostname) // p * p :][:p] }}",
        "'listen': host ~ ':' ~ (port | int + loop.index0),",
        "| product(range(29000, 29000 + [models, 1] | max)) | map('join', ':') | list }}",
        "{{ units | map(attribute='unit') | map('regex_replace', '$', '.service') | list }}",
    ],
)
def test_the_scan_finds_what_the_roles_computed_before(line):
    assert computed(line) == [line.strip()]
