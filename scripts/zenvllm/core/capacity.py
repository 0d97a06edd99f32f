"""Sizing a load: how many requests a plan's host serves within the operator's target, and
so how many hosts of its kind a load needs (`zenvllm plan --load ... --slo ...`). Pure.

Each instance takes the most requests at once that keep the target (TPOT, TTFT and each
user's tokens per second, as core/performance.py predicts them at that batch), that its
KV cache holds at the load's tokens per request, and that vLLM's scheduler runs
(max_num_seqs); a host serves that many per instance, and the load is spread evenly over
as many identical hosts as it needs (a copy cut in pipeline stages takes a group of
hosts). A target the host misses with one request alone is refused: no number of such
hosts meets it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from zenvllm.core import performance
from zenvllm.core.errors import PlanError
from zenvllm.core.host import GIB
from zenvllm.core.model import POOLING
from zenvllm.core.performance import Layout, Load, Prediction, Shape, Slo
from zenvllm.core.plan import Plan, layout_of, machine_of


@dataclass(frozen=True)
class Capacity:
    load: Load
    slo: Slo | None
    batch: int  # requests at once per instance within the target and the memory
    limit: str  # what stops the batch there
    per_host: float  # clients (or requests/s, for a rate) one host (or group) serves
    hosts: int  # hosts of this kind the load needs
    fleet: Prediction  # every host at its share of the load
    lines: tuple[str, ...]  # the reasoning

    def to_dict(self) -> dict[str, Any]:
        return {
            "load": self.load.text,
            "slo": self.slo.text if self.slo else None,
            "batch_per_instance": self.batch,
            "limited_by": self.limit,
            "per_host": round(self.per_host, 3),
            "hosts": self.hosts,
            "predicted": {
                "tpot_ms": round(self.fleet.tpot_ms, 1),
                "ttft_ms": round(self.fleet.ttft_ms, 1),
                "output_tok_s": round(self.fleet.output_tok_s, 1),
                "batch_per_instance": round(self.fleet.batch, 2),
            },
            "why": list(self.lines),
        }


def missed(slo: Slo | None, at: Prediction) -> str:
    """The first target `at` misses, said with both figures; "" when it meets them."""
    if slo is None:
        return ""
    if slo.tpot_ms and at.tpot_ms > slo.tpot_ms:
        return f"TPOT {at.tpot_ms:,.0f} ms against tpot_ms={slo.tpot_ms:g}"
    if slo.ttft_ms and at.ttft_ms > slo.ttft_ms:
        return f"TTFT {at.ttft_ms:,.0f} ms against ttft_ms={slo.ttft_ms:g}"
    if slo.user_tok_s and 1000 / at.tpot_ms < slo.user_tok_s:
        return f"{1000 / at.tpot_ms:.1f} tokens/s per user against user_tok_s={slo.user_tok_s:g}"
    return ""


def kv_room(plan: Plan, shape: Shape, tokens: int) -> int | None:
    """Requests of `tokens` tokens the smallest instance's KV cache holds (each rank holds
    its share of every token); None when the model's KV bytes are unknown."""
    if not shape.kv_bytes_per_token:
        return None
    held = min(i.kv_cache_gib * max(1, len(i.ranks)) for i in plan.instances) * GIB
    return int(held // (shape.kv_bytes_per_token * tokens))


def per_instance(plan: Plan, shape: Shape, layout: Layout, load: Load) -> tuple[int, str]:
    """The scheduler's and the KV cache's most requests at once per instance."""
    tokens = load.prompt + load.output
    longest = plan.max_model_len
    if longest and tokens > longest:
        raise PlanError(
            f"--load in={load.prompt},out={load.output}: {tokens:,} tokens per request, over "
            f"the {longest:,} this plan serves (max_model_len); give --max-model-len {tokens} "
            "or more, or shorter requests"
        )
    room = kv_room(plan, shape, tokens)
    if room is not None and room < 1:
        need = shape.kv_bytes_per_token * tokens / GIB
        raise PlanError(
            f"--load in={load.prompt},out={load.output}: one request's {tokens:,} tokens need "
            f"{need:.1f} GiB of KV cache, more than an instance's; give --kv-cache-gib "
            f"{math.ceil(need)} or more, a flavor with more memory, or shorter requests"
        )
    most = plan.policy.max_num_seqs
    if room is None:
        return most, f"vLLM's max_num_seqs {most} (the model's KV bytes per token are unknown)"
    if room < most:
        return room, f"the KV cache, which holds {room} requests of {tokens:,} tokens"
    return most, f"vLLM's max_num_seqs {most} (the KV cache holds {room})"


def refusal(slo: Slo, alone: Prediction, layout: Layout, plan: Plan) -> PlanError:
    flavor = plan.host.source
    return PlanError(
        f"--slo {slo.text}: no number of hosts of this kind ({flavor}) meets it: one request "
        f"alone on an instance of {layout.cores} core(s) gets TPOT {alone.tpot_ms:,.0f} ms "
        f"and TTFT {alone.ttft_ms:,.0f} ms, the least these hosts give ({missed(slo, alone)}). "
        "Use a flavor with more cores or bandwidth per instance (`zenvllm calibrate` "
        "measures a real host's, where the spec sheet's default is low), a smaller or "
        f"quantized model, or a target of at least TPOT {alone.tpot_ms:,.0f} ms and TTFT "
        f"{alone.ttft_ms:,.0f} ms"
    )


def size(plan: Plan) -> Capacity | None:
    """The plan against its policy's load and target (None without a load)."""
    load, slo = plan.policy.load, plan.policy.slo
    if load is None:
        return None
    model = plan.model
    if model.weight_bytes <= 0:
        raise PlanError("--load needs the model's size: give --model DIR or --model-size-gib N")
    if model.runner == POOLING:
        raise PlanError(
            f"--load sizes decode steps, and {model.name} is a pooling model ({model.runner_why}),"
            " which has none: measure its inputs/s with `zenvllm bench` instead"
        )
    machine, shape = machine_of(plan.host, model, plan.policy), performance.shape_of(model)
    layout = layout_of(plan.instances)
    most, limit = per_instance(plan, shape, layout, load)
    alone = performance.predict(shape, machine, layout, load, 1)
    if slo is not None and missed(slo, alone):
        raise refusal(slo, alone, layout, plan)

    def at(batch: float) -> Prediction:
        return performance.predict(shape, machine, layout, load, batch)

    batch = next(b for b in range(most, 0, -1) if not missed(slo, at(b)))
    if batch < most:
        limit = f"the target: one more would miss it ({missed(slo, at(batch + 1))})"
    at_most = at(batch)
    group = layout.stages  # hosts a copy takes
    latency_s = (at_most.ttft_ms + load.output * at_most.tpot_ms) / 1000
    if load.concurrency:
        per_host = float(layout.instances * batch)
        hosts = group * math.ceil(load.concurrency / per_host)
    else:
        per_host = layout.instances * batch / latency_s
        hosts = group * math.ceil(load.rate / per_host)
    fleet_layout = replace(layout, instances=layout.instances * hosts // group)
    fleet = performance.predict(
        shape, machine, fleet_layout, load, performance.batch_of(shape, machine, fleet_layout, load)
    )
    sized = Capacity(load, slo, batch, limit, per_host, hosts, fleet, ())
    return replace(sized, lines=tuple(reasoning(sized, machine, layout, alone, at_most)))


def reasoning(
    sized: Capacity,
    machine: performance.Machine,
    layout: Layout,
    alone: Prediction,
    at_most: Prediction,
) -> list[str]:
    load, slo, per_host, fleet = sized.load, sized.slo, sized.per_host, sized.fleet
    asked, unit = (load.concurrency, "clients") if load.concurrency else (load.rate, "requests/s")
    shown = f"{per_host:,.0f}" if load.concurrency else f"{per_host:,.3g}"
    host = "host" if layout.stages == 1 else f"group of {layout.stages} hosts (a copy's stages)"
    lines = [
        f"load {load.text}{f', target {slo.text}' if slo else ''}: predicted by "
        f"core/performance.py from {machine.core_gbs:g} GB/s and {machine.compute.gflops:g} "
        f"GFLOP/s per core (the plan's notes say where each comes from; within "
        f"{performance.ERROR_BOUND:.0%} of the recorded 2-core bench runs)",
        f"each instance ({layout.cores} cores): one request alone gets TPOT "
        f"{alone.tpot_ms:,.0f} ms, TTFT {alone.ttft_ms:,.0f} ms; it takes up to {sized.batch} at "
        f"once (TPOT {at_most.tpot_ms:,.0f} ms, TTFT {at_most.ttft_ms:,.0f} ms, each request's "
        f"tokens waiting for the others' {load.prompt}-token prompts), limited by "
        f"{sized.limit}",
        f"one {host} serves {layout.instances} instance(s) x {sized.batch} at once = {shown} {unit}"
        f"{' within the target' if slo else ''}",
    ]
    predicted = (
        f"predicted TPOT {fleet.tpot_ms:,.0f} ms, TTFT {fleet.ttft_ms:,.0f} ms, "
        f"{fleet.output_tok_s:,.0f} output tok/s"
    )
    if sized.hosts == layout.stages:
        lines.append(
            f"this {host} meets the load: {asked:g} {unit} of its {shown}, {predicted}; "
            f"headroom {per_host / asked - 1:.0%}"
        )
    else:
        lines.append(
            f"the load needs {sized.hosts} hosts of this kind ({asked:g} {unit} / {shown} per "
            f"{host}, rounded up), each laid out as this plan, a router spreading the clients "
            f"over them: {fleet.batch:.1f} requests per instance, {predicted} in all"
        )
    return lines
