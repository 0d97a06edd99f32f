"""The plan as JSON: the contract `zenvllm plan --json` prints and the instances role,
status and the docs read. One model's plan, or several models' plans on one host as one
document: the whole host, every model (`models`, each with its instances' names) and
every instance with its container, so the role renders each as it does one model's.
Pure; standard library only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zenvllm.core.container import container_of
from zenvllm.core.host import GIB, Host
from zenvllm.core.request import Request

if TYPE_CHECKING:
    from zenvllm.core.plan import Plan


def host_dict(host: Host) -> dict[str, Any]:
    limit = host.cgroup_mem_limit_bytes
    return {
        "source": host.source,
        "vendor": host.vendor,
        "model_name": host.model_name,
        "generation": host.generation,
        "family": host.family,
        "cpu_model": host.cpu_model,
        "cpus": [c.id for c in host.cpus],
        "allowed_cpus": sorted(host.allowed_cpus),
        "smt": host.smt,
        "isa": sorted(host.isa),
        "mem_total_gib": round(host.mem_total_bytes / GIB, 2),
        "cgroup_mem_limit_gib": round(limit / GIB, 2) if limit is not None else None,
        "nodes": [
            {"id": n.id, "cpus": list(n.cpus), "mem_total_gib": round(n.mem_total_bytes / GIB, 2)}
            for n in host.nodes
        ],
    }


def model_dict(plan: Plan) -> dict[str, Any]:
    model = plan.model
    return {
        "name": model.name,
        "dtype": model.dtype,
        "runner": model.runner,
        "weight_gib": round(model.weight_gib, 3),
        "kv_bytes_per_token": model.kv_bytes_per_token,
        "quantization": q.label if (q := model.quantization) else None,
        "max_model_len": plan.max_model_len,
    }


def max_concurrency(plan: Plan) -> int:
    """Requests the instances can run at once: what the gateway's limits size from."""
    return len(plan.instances) * plan.policy.max_num_seqs


def one(plan: Plan, request: Request | None = None, secrets: str = "") -> dict[str, Any]:
    """One model's plan; each instance carries its container as `request` asks (its
    supervisor decided), `secrets` the digest of the env files' secrets. `models` lists
    the model too, as a plan of several models does."""
    request = request or Request(deployment=plan.policy.name_prefix, supervisor="systemd")
    containers = [container_of(i, request, secrets) for i in plan.instances]
    served = {
        "served_name": request.served_name,
        **model_dict(plan),
        "instances": [i.name for i in plan.instances],
        # Where it answers: what the gateway sends its requests to (a headless stage
        # of a copy cut over hosts answers at its head).
        "urls": [c.url for c in containers if c.serves],
        "max_concurrency": max_concurrency(plan),
    }
    return {
        "host": host_dict(plan.host),
        "model": model_dict(plan),
        "models": [served],
        "target": plan.policy.target,
        "layout": plan.policy.layout,
        "max_concurrency": max_concurrency(plan),
        "instances": [
            {**i.to_dict(), "container": c.to_dict()}
            for i, c in zip(plan.instances, containers, strict=True)
        ],
        "warnings": list(plan.warnings),
        "notes": list(plan.notes),
    }


def several(host: Host, planned: list[tuple[Request, Plan]], secrets: str) -> dict[str, Any]:
    """Several models' plans on one host as one: the whole host (each plan holds only
    its part), their instances together, each warning and note named by its model."""
    docs = [(asked.served_name, one(plan, asked, secrets)) for asked, plan in planned]

    def named(name: str, text: str) -> str:
        return text if text.startswith(f"{name}: ") else f"{name}: {text}"

    return {
        "host": host_dict(host),
        "models": [m for _, doc in docs for m in doc["models"]],
        "target": docs[0][1]["target"],
        "layout": docs[0][1]["layout"],
        "max_concurrency": sum(doc["max_concurrency"] for _, doc in docs),
        "instances": [i for _, doc in docs for i in doc["instances"]],
        "warnings": [named(n, w) for n, doc in docs for w in doc["warnings"]],
        "notes": [named(n, note) for n, doc in docs for note in doc["notes"]],
    }
