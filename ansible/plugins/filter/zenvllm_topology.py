"""The fleet's topology as Ansible filters, zenvllm.cpu.pipeline_hosts and the rest:
zenvllm/deploy/topology.py decides, the roles print (the controller's zenvllm package,
installed beside the collection)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zenvllm.deploy import topology


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "pipeline_hosts": topology.pipeline_hosts,
            "host_rank": topology.host_rank,
            "router_units": topology.router_units,
            "router_targets": topology.router_targets,
        }
