"""What a deployment's plan promised an instance's container, and what differs.

The planner writes the promise into the instance's env (`ZENVLLM_PLAN`); the
image launcher of a deployed container checks its own cgroup, cpuset, /dev/shm
and target against it instead of planning again, which inside the container
(seeing only its own --memory cap) gave other numbers than the host's plan.
A bare `docker run IMAGE --model M` has no promise and still plans itself.
Pure functions; standard library only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from zenvllm.core import gate
from zenvllm.core.host import MIB, Host
from zenvllm.core.topology import format_cpu_list, parse_cpu_list

ENV_KEY = "ZENVLLM_PLAN"


@dataclass(frozen=True)
class Promise:
    name: str
    target: str
    cpus: str  # the kernel's list format, as --cpuset-cpus takes it
    mems: str
    shm_mib: int
    memory_mib: int


def encode(promise: Promise) -> str:
    return json.dumps(asdict(promise), separators=(",", ":"))


def decode(text: str) -> Promise:
    fix = (
        "leave it to the deployment's env file, or unset it to let the launcher plan this container"
    )
    where = f"${ENV_KEY}"
    fields = gate.obj(gate.parse_json(text, where, fix), where, fix)
    if set(fields) != set(Promise.__dataclass_fields__):
        raise gate.InputError(
            f"{where} has fields {', '.join(sorted(fields))[:120]}, not those of a zenvllm plan "
            f"({', '.join(Promise.__dataclass_fields__)}); {fix}"
        )
    text_of = {k: gate.text(fields[k], f"{where}: {k}", fix) for k in ("name", "target")}
    lists = {k: gate.text(fields[k], f"{where}: {k}", fix) for k in ("cpus", "mems")}
    sizes = {
        k: gate.whole(fields[k], f"{where}: {k}", 1, 1 << 40, fix)
        for k in ("shm_mib", "memory_mib")
    }
    promise = Promise(
        text_of["name"],
        text_of["target"],
        lists["cpus"],
        lists["mems"],
        sizes["shm_mib"],
        sizes["memory_mib"],
    )
    for key in ("cpus", "mems"):
        try:
            parse_cpu_list(getattr(promise, key))
        except ValueError as err:
            raise gate.InputError(f"{where}: {key}: {err}; {fix}") from None
    return promise


def differences(promise: Promise, host: Host, shm_total_mib: int | None, target: str) -> list[str]:
    """Each way this container is not what the plan promised; empty when it is."""
    found = []
    cpus = format_cpu_list(host.allowed_cpus)
    if cpus != promise.cpus:
        found.append(f"CPUs {cpus}, planned {promise.cpus}")
    mems = format_cpu_list(host.allowed_mems)
    if mems != promise.mems:
        found.append(f"memory nodes {mems}, planned {promise.mems}")
    limit = host.cgroup_mem_limit_bytes
    if limit is None or limit // MIB != promise.memory_mib:
        have = "none" if limit is None else f"{limit // MIB} MiB"
        found.append(f"memory limit {have}, planned {promise.memory_mib} MiB")
    if shm_total_mib is not None and shm_total_mib != promise.shm_mib:
        found.append(f"/dev/shm {shm_total_mib} MiB, planned {promise.shm_mib} MiB")
    if target != promise.target:
        found.append(f"image target {target}, planned {promise.target}")
    return found
