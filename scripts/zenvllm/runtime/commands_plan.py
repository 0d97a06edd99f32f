"""`zenvllm plan`: read the host (or a flavor) and the model, print the plan."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from zenvllm.core import arguments, calibration, gate
from zenvllm.core.arguments import real, whole
from zenvllm.core.calibration import DEFAULT_PATH
from zenvllm.core.container import Settings
from zenvllm.core.flavors import PRESETS, synthetic_host
from zenvllm.core.host import GIB, Host
from zenvllm.core.model import Model, model_of_size, read_model
from zenvllm.core.plan import LAYOUTS, Plan, Policy, make_plan
from zenvllm.core.targets import TARGETS
from zenvllm.core.topology import format_cpu_list, read_host
from zenvllm.runtime import calibrate


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by every verb that plans (plan, bench, the launcher)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="read sysfs/procfs under this directory (default /)",
    )
    where.add_argument(
        "--flavor",
        help=f"plan a synthetic host: {', '.join(PRESETS)} "
        "or vcpus=N,ram_gib=N[,numa=N][,smt=1|2][,cpu=NAME]",
    )
    model = parser.add_mutually_exclusive_group()
    model.add_argument(
        "--model", type=Path, help="local model directory (config.json, safetensors)"
    )
    model.add_argument(
        "--model-size-gib", type=real(0, example=16), help="model weights in GiB, when not local"
    )
    parser.add_argument(
        "--instances",
        type=arguments.instances,
        default=None,
        metavar="N|auto",
        help="number of vLLM instances (default auto)",
    )
    parser.add_argument("--target", choices=sorted(TARGETS), default="vllm-openai")
    parser.add_argument(
        "--allow-inactive",
        action="store_true",
        help="plan zen or pace on a CPU that cannot accelerate them (a warning, not an error)",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="contiguous",
        help="cores of an instance side by side (L3-packed) or every k-th",
    )
    parser.add_argument("--base-port", type=arguments.port, default=8001)
    parser.add_argument(
        "--kv-cache-gib",
        type=whole(1, 1 << 20, example=4),
        help="KV cache per instance (default sized)",
    )
    parser.add_argument(
        "--kv-fraction",
        type=real(0, 1, example=0.9),
        default=0.9,
        help="share of a node's leftover memory given to KV caches",
    )
    parser.add_argument(
        "--name-prefix",
        type=arguments.name,
        default="zenvllm",
        help="instances are named PREFIX-0, PREFIX-1, ... (a deployment's name)",
    )
    parser.add_argument(
        "--max-model-len", type=arguments.max_model_len, help="context length vLLM will serve"
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        help=f"figures `zenvllm calibrate` measured (default {DEFAULT_PATH} when planning "
        "this host and it exists)",
    )


def host_from(args: argparse.Namespace) -> Host:
    return synthetic_host(args.flavor) if args.flavor else read_host(args.root)


def model_from(args: argparse.Namespace) -> Model:
    if args.model:
        return read_model(args.model)
    if args.model_size_gib is not None:
        return model_of_size(args.model_size_gib)
    return Model(name="unknown", weight_bytes=0)


def policy_from(args: argparse.Namespace) -> Policy:
    return Policy(
        instances=args.instances,
        target=args.target,
        allow_inactive=args.allow_inactive,
        name_prefix=args.name_prefix,
        layout=args.layout,
        base_port=args.base_port,
        kv_cache_gib=args.kv_cache_gib,
        kv_fraction=args.kv_fraction,
        max_model_len=args.max_model_len,
    )


def plan_from(args: argparse.Namespace) -> Plan:
    host = host_from(args)
    live = not args.flavor and args.root.resolve() == Path("/")
    cal, source = calibrate.read(args.calibration, live)
    model = model_from(args)
    policy, ignored = calibration.apply(policy_from(args), cal, host, source, model)
    plan = make_plan(host, model, policy)
    return replace(plan, warnings=(*plan.warnings, ignored)) if ignored else plan


def render_table(plan: Plan) -> str:
    host = plan.host
    lines = [
        f"host: {host.source}  {host.model_name or '?'} ({host.vendor or '?'})",
        f"      {len(host.cpus)} CPUs ({len(host.allowed_cpus)} allowed), "
        f"{'SMT' if host.smt else 'no SMT'}, {len(host.nodes)} NUMA node(s), "
        f"{host.mem_total_bytes / GIB:.1f} GiB, ISA: {' '.join(sorted(host.isa)) or 'none'}",
        f"model: {plan.model.name}, {plan.model.weight_gib:.2f} GiB weights; "
        f"target {plan.policy.target}",
        "",
        f"{'instance':<12}{'port':>6}{'node':>6}  {'cpuset':<16}{'omp bind':<16}"
        f"{'KV GiB':>7}{'shm MiB':>9}{'mem MiB':>9}",
    ]
    for i in plan.instances:
        lines.append(
            f"{i.name:<12}{i.port:>6}{i.node:>6}  {format_cpu_list(i.cpus):<16}"
            f"{i.omp_threads_bind:<16}{i.kv_cache_gib:>7}{i.shm_size_mib:>9}{i.memory_limit_mib:>9}"
        )
    lines += ["", "why:"] + [f"  - {n}" for n in plan.notes]
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def settings_from(args: argparse.Namespace) -> Settings:
    """The deployment's container settings: --deployment-json, secrets from the env
    (ZENVLLM_SECRETS, a JSON object: never on the command line, never printed)."""
    fix = "give ZENVLLM_SECRETS a JSON object of strings (the instances role writes it)"
    secrets = gate.env_json("ZENVLLM_SECRETS", fix) or {}
    if not isinstance(secrets, dict) or not all(isinstance(v, str) for v in secrets.values()):
        # Never shown: the value holds secrets.
        raise gate.InputError(f"$ZENVLLM_SECRETS is not a JSON object of strings; {fix}")
    text = args.deployment_json or json.dumps({"deployment": args.name_prefix})
    return Settings.from_json(text, secrets)


def run(args: argparse.Namespace) -> int:
    plan = plan_from(args)
    if args.json:
        print(json.dumps(plan.to_dict(settings_from(args)), indent=2))
    else:
        print(render_table(plan))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="decide instances, cores, memory, KV cache")
    add_plan_options(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--deployment-json",
        help="the deployment's container settings as a JSON object (image, model_dir, ...): "
        "each instance's container in --json follows them",
    )
    parser.set_defaults(func=run)
