"""The fleet's shape, decided once: the hosts of each copy cut over hosts and each host's
stage, the routers' units and ports, and the routers' metrics Prometheus scrapes.

The roles call these as Ansible filters (zenvllm.cpu.pipeline_hosts and the rest:
ansible/plugins/filter/zenvllm_topology.py)
and print what they return: no role default, vars file or template computes an index, a
port or a unit name (tests/unit/test_topology_roles.py scans them). Pure; standard
library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# The first model's router metrics; each next model's router on the next port.
ROUTER_METRICS_PORT = 29000


def pipeline_hosts(fleet: Sequence[str], host: str, hosts: int) -> list[str]:
    """`host`'s run of `hosts` hosts of the fleet, head first, in inventory order: the
    first `hosts` hosts make one copy, the next `hosts` the next. A whole copy (hosts 1),
    or a host outside the fleet, is its own run."""
    hosts = int(hosts)
    if hosts <= 1 or host not in fleet:
        return [host]
    start = list(fleet).index(host) // hosts * hosts
    return list(fleet[start : start + hosts])


def host_rank(pipeline: Sequence[str], host: str) -> int:
    """`host`'s stage in its copy's run: 0, the head, for a host outside it."""
    return list(pipeline).index(host) if host in pipeline else 0


def _at(address: str, offset: int) -> str:
    """host:port, `offset` ports on."""
    host, port = address.rsplit(":", 1)
    return f"{host}:{int(port) + offset}"


def router_units(
    models: Sequence[Mapping[str, Any]], name: str, listen: str, metrics_listen: str
) -> list[dict[str, Any]]:
    """One router per model (vllm-router serves one), in the order of the served names:
    the first on `listen` and `metrics_listen`, each next one on the next ports. One model
    keeps the unit's plain `name`; with several, each unit adds its model's name. Each
    names its model and URL as the gateway's models do (served_name, urls), and the
    instances behind it (`workers`, from every host's `models` entry of that name)."""
    names = sorted({str(m["served_name"]) for m in models})
    units = []
    for i, served in enumerate(names):
        at = _at(listen, i)
        unit = name if len(names) == 1 else f"{name}-{re.sub(r'[^A-Za-z0-9_.-]', '_', served)}"
        urls = [u for m in models if m["served_name"] == served for u in m["urls"]]
        units.append(
            {
                "served_name": served,
                "unit": unit,
                "unit_file": f"{unit}.service",
                "listen": at,
                "urls": [f"http://{at}"],
                "metrics_listen": _at(metrics_listen, i),
                "workers": list(dict.fromkeys(urls)),
            }
        )
    return units


def router_targets(
    addresses: Sequence[str], models: int, port: int = ROUTER_METRICS_PORT
) -> list[str]:
    """Every router's metrics listener: on each router host (those with an address), one
    port per model from `port`, at least one."""
    return [f"{a}:{port + i}" for a in addresses if a for i in range(max(int(models), 1))]
