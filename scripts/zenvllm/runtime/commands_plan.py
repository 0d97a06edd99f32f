"""`zenvllm plan`: read the host (or a flavor) and the model, print the plan."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zenvllm.core import arguments, calibration, capacity, gate, model_list, plan_doc, request
from zenvllm.core.arguments import NAME, real, whole
from zenvllm.core.calibration import DEFAULT_PATH
from zenvllm.core.container import secrets_digest
from zenvllm.core.errors import UserError
from zenvllm.core.flavors import synthetic_host
from zenvllm.core.host import GIB, Host
from zenvllm.core.model import Model, model_of_size, read_model
from zenvllm.core.plan import Plan, Policy, make_plan
from zenvllm.core.request import Request
from zenvllm.core.shares import plan_models
from zenvllm.core.topology import format_cpu_list, read_host
from zenvllm.runtime import calibrate, engine


def absolute(path: str) -> str:
    """A directory as the plan and --read-model name it: absolute, as text (so that a
    staged copy's DIR and the request's directory compare equal)."""
    return str(Path(path).absolute())


def flag_type(name: str) -> Callable[[str], object]:
    """The argparse type of an option's flag, from its Spec's kind and limits."""
    spec, kind = request.spec_of(name), request.kind(name)
    example = float(spec.example) if kind in ("count", "int", "float") else 0.0
    if kind == "count":
        number = whole(int(spec.low or 1), example=int(example))
        return lambda text: text if text == "auto" else number(text)
    if kind == "int":
        return whole(int(spec.low or 0), int(spec.high or 1 << 31), example=int(example))
    if kind == "float":
        return real(float(spec.low or 0), spec.high, example=example)
    if spec.path:
        return absolute
    if spec.pattern:
        return arguments.name
    if spec.ip:
        return arguments.ip_address
    if spec.parse:
        return parsed(spec.parse)
    return str


def parsed(parse: Callable[[str], object]) -> Callable[[str], str]:
    """A structured string (--load, --slo) refused by argparse as its parser says; the
    request keeps the text."""

    def check(text: str) -> str:
        try:
            parse(text)
        except UserError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text

    return check


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    """The request's flags (core/request.py: every default and help there); a flag not
    given leaves the option as --request (or the default) has it."""
    flagged = [(n, s, d) for n, s, d in request.specs() if s.flag]
    # argparse's usage wants a group's flags side by side: each group at its first flag.
    order = [s.exclusive or n for n, s, _ in flagged]
    flagged.sort(key=lambda o: order.index(o[1].exclusive or o[0]))
    groups: dict[str, argparse._ActionsContainer] = {}
    for name, spec, default in flagged:
        if spec.exclusive and spec.exclusive not in groups:
            groups[spec.exclusive] = parser.add_mutually_exclusive_group()
        into = groups[spec.exclusive] if spec.exclusive else parser
        flags = [spec.flag, *(["--name-prefix"] if name == "deployment" else [])]
        shown = json.dumps(default) if default not in ("", 0) else "none"
        how: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        if name == "model_dir":  # given more than once: NAME=DIR, several models (MODELS)
            how |= {"action": "append", "metavar": "[NAME=]DIR", "help": f"{spec.help}; {MODELS}"}
        elif request.kind(name) == "bool":
            how |= {"action": "store_true", "help": spec.help}
        else:
            how |= {"type": flag_type(name), "help": f"{spec.help} (default {shown})"}
            if spec.choices:
                how["choices"] = spec.choices
            else:
                how["metavar"] = "N|auto" if spec.auto else spec.flag[2:].upper().replace("-", "_")
        into.add_argument(*flags, **how)
    parser.add_argument(
        "--share",
        action="append",
        default=[],
        type=share_arg,
        metavar="NAME=cores:N|weight:W",
        help="one model's share of the host, with several --model NAME=DIR: N physical "
        "cores, or a weight (default: its weight bytes)",
    )
    parser.add_argument(
        "--request",
        metavar="JSON",
        help="the deployment request as one JSON object (what the instances role sends): "
        "its options are those of docs/reference/variables.md; flags given override it",
    )
    parser.add_argument(
        "--read-model",
        action="append",
        default=[],
        type=staged_arg,
        metavar="DIR=STAGED",
        help="read the model whose directory is DIR from STAGED (a copy staged in check "
        "mode, where DIR is not on the host yet); once per model",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        help=f"figures `zenvllm calibrate` measured (default {DEFAULT_PATH} when planning "
        "this host and it exists)",
    )


MODELS = (
    "given as NAME=DIR, more than once, several models share the host, each on cores of "
    "its own and served as NAME"
)


def share_arg(text: str) -> str:
    """NAME=cores:N or NAME=weight:W, refused by value with an example."""
    if model_list.share(text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not {model_list.SHARE}")
    return text


def staged_arg(text: str) -> tuple[str, str]:
    """DIR=STAGED, split at the last "=" (a staged copy's path has none), DIR absolute."""
    where, eq, staged = text.rpartition("=")
    if not (eq and where and staged):
        raise argparse.ArgumentTypeError(f"{text!r} is not DIR=STAGED")
    return absolute(where), staged


@dataclass(frozen=True)
class Reading:
    """What `zenvllm plan` reads besides the request: the copies staged in check mode
    (--read-model DIR=STAGED) and the calibration file (--calibration)."""

    staged: tuple[tuple[str, str], ...] = ()
    calibration_file: Path | None = None


def models_asked(given: Sequence[str]) -> list[tuple[str, str]]:
    """(served name, directory) per --model given as NAME=DIR; [] for one plain --model."""
    named = [g.partition("=") for g in given]
    if len(given) == 1 and not (named[0][1] and NAME.fullmatch(named[0][0])):
        return []
    pairs = zip(given, named, strict=True)
    bad = [g for g, (n, eq, d) in pairs if not (eq and d and NAME.fullmatch(n))]
    if bad:
        raise UserError(
            f"--model {bad[0]}: with several models each is NAME=DIR (e.g. --model "
            "chat=/srv/models/qwen --model embed=/srv/models/minilm)"
        )
    return [(n, absolute(d)) for n, _, d in named]


def request_from(options: Mapping[str, Any]) -> Request:
    """--request, with the flags given over it (`options`: the command line's values by
    name); supervisor auto decided as the role does (systemd where it is PID 1 under
    --root)."""
    text = options.get("request")
    base = request.from_json(text) if text else request.DEFAULT
    given = {n: options[n] for n, s, _ in request.specs() if s.flag and n in options}
    if "model_dir" in given:  # one plain DIR, as before; several: NAME=DIR entries
        dirs = given.pop("model_dir")
        named = models_asked(dirs or [])
        if named:
            given["models"] = tuple(f"{n}={d}" for n, d in named)
        else:
            given["model_dir"] = absolute(dirs[0])  # a path, "=" and all
    if options.get("share"):
        given["shares"] = tuple(options["share"])
    asked = request.several_checked(replace(base, **given), "zenvllm plan")
    if asked.supervisor == "auto":
        booted = asked.flavor or (Path(asked.sysfs_root) / "run/systemd/system").is_dir()
        asked = replace(asked, supervisor="systemd" if booted else "engine")
    return with_cgroups(asked)


def with_cgroups(asked: Request) -> Request:
    """The engine's cgroup driver and where cgroup v2 is mounted, read on the host where a
    copy may be cut over hosts (they name its group's cgroup: core/group_guard.py); a
    flavor's plan assumes a v2 host's."""
    if asked.hosts < 2:
        return asked
    if asked.cgroup2_mount == "auto":
        root = Path(asked.sysfs_root) / "sys/fs/cgroup"
        found = [m for m in ("", "unified") if (root / m / "cgroup.controllers").is_file()]
        asked = replace(asked, cgroup2_mount="" if asked.flavor else [*found, "none"][0])
    if asked.cgroup_driver == "auto" and not asked.flavor:
        asked = replace(asked, cgroup_driver=engine.cgroup_driver() or "auto")
    return asked


def host_from(asked: Request) -> Host:
    return synthetic_host(asked.flavor) if asked.flavor else read_host(Path(asked.sysfs_root))


def staged_for(reading: Reading, dirs: list[str]) -> dict[str, str]:
    """--read-model's DIR -> STAGED, each DIR one of the request's model directories."""
    staged = dict(reading.staged)
    wanted = {absolute(d) for d in dirs}
    stray = sorted(set(staged) - wanted)
    if stray:
        raise UserError(
            f"--read-model {stray[0]}=...: no model of the request is in {stray[0]} (its "
            f"models are in {', '.join(sorted(wanted)) or 'no directory'}); give DIR as the "
            "request names it"
        )
    return staged


def model_from(asked: Request, staged: Mapping[str, str]) -> Model:
    """The request's model: of the size given, or read from its directory (or from the
    copy staged for it in check mode, named as its directory is)."""
    if asked.model_size_gib > 0:
        return model_of_size(asked.model_size_gib)
    if asked.model_dir:
        where = absolute(asked.model_dir)
        return replace(read_model(Path(staged.get(where, where))), name=Path(where).name)
    return Model(name="unknown", weight_bytes=0)


def calibrated(
    reading: Reading, asked: Request, host: Host
) -> Callable[[Request, Model], tuple[Policy, str]]:
    """The request's policy for a model with this host's calibration applied, and the
    warning when the calibration was ignored ("" when not)."""
    live = not asked.flavor and Path(asked.sysfs_root).resolve() == Path("/")
    cal, source = calibrate.read(reading.calibration_file, live)
    return lambda one, model: calibration.apply(Policy.of(one), cal, host, source, model)


def warned(plan: Plan, ignored: str) -> Plan:
    return replace(plan, warnings=(*plan.warnings, ignored)) if ignored else plan


def plan_from(asked: Request, reading: Reading) -> Plan:
    host = host_from(asked)
    model = model_from(asked, staged_for(reading, [asked.model_dir] if asked.model_dir else []))
    policy, ignored = calibrated(reading, asked, host)(asked, model)
    return warned(make_plan(host, model, policy), ignored)


def render_capacity(sized: capacity.Capacity) -> str:
    """The load's hosts and why, after the plan's table (each host is laid out as it)."""
    lines = [f"capacity: {sized.hosts} host(s) of this kind", *(f"  - {x}" for x in sized.lines)]
    return "\n\n" + "\n".join(lines)


def render_table(plan: Plan) -> str:
    host = plan.host
    lines = [
        f"host: {host.source}  {host.cpu_name} ({host.vendor or '?'})",
        f"      {len(host.cpus)} CPUs ({len(host.allowed_cpus)} allowed), "
        f"{'SMT' if host.smt else 'no SMT'}, {len(host.nodes)} NUMA node(s), "
        f"{host.mem_total_bytes / GIB:.1f} GiB, ISA: {' '.join(sorted(host.isa)) or 'none'}",
        f"model: {plan.model.name}, {plan.model.weight_gib:.2f} GiB weights in "
        f"{plan.model.dtype}; "
        f"target {plan.policy.target}",
        "",
        f"{'instance':<12}{'port':>6}{'node':>6}  {'cpuset':<16}{'omp bind':<16}"
        f"{'KV GiB':>7}{'shm MiB':>9}{'mem MiB':>9}",
    ]
    for i in plan.instances:
        nodes = format_cpu_list(r.node for r in i.ranks) if i.ranks else str(i.node)
        lines.append(
            f"{i.name:<12}{i.port:>6}{nodes:>6}  {format_cpu_list(i.cpus):<16}"
            f"{i.omp_threads_bind:<16}{i.kv_cache_gib:>7}{i.shm_size_mib:>9}{i.memory_limit_mib:>9}"
        )
    stages = max((i.pipeline_parallel_size for i in plan.instances), default=1)
    if stages > 1:
        lines.append(
            f"(each copy is cut over {stages} hosts of this kind, one stage per host: the table "
            "is every host's part; --host-rank R renders host R's containers, 0 the head's)"
        )
    lines += ["", "why:"] + [f"  - {n}" for n in plan.notes]
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def secrets_from_env() -> str:
    """The digest of the deployment's secrets (ZENVLLM_SECRETS, a JSON object: never on
    the command line, never printed)."""
    fix = "give ZENVLLM_SECRETS a JSON object of strings (the instances role writes it)"
    secrets = gate.env_json("ZENVLLM_SECRETS", fix) or {}
    if not isinstance(secrets, dict) or not all(isinstance(v, str) for v in secrets.values()):
        # Never shown: the value holds secrets.
        raise gate.InputError(f"$ZENVLLM_SECRETS is not a JSON object of strings; {fix}")
    return secrets_digest(secrets)


def plans_from(asked: Request, reading: Reading) -> tuple[Host, list[tuple[Request, Plan]]]:
    """Several models on one host: each on its share (core/shares.py), its request the
    deployment's with its own directory and served name."""
    named = model_list.models_of(asked.models, "models")
    chosen = model_list.shares_of(asked.shares, [n for n, _ in named], "shares")
    host = host_from(asked)
    asks = [
        replace(
            asked,
            models=(),
            shares=(),
            model_dir=d,
            served_model_name=n,
        )
        for n, d in named
    ]
    staged = staged_for(reading, [d for _, d in named])
    models = [model_from(a, staged) for a in asks]
    policy_of = calibrated(reading, asked, host)
    applied = [policy_of(a, m) for a, m in zip(asks, models, strict=True)]
    plans = plan_models(host, models, chosen, [policy for policy, _ in applied])
    pairs = zip(asks, plans, applied, strict=True)
    return host, [(a, warned(p, ignored)) for a, p, (_, ignored) in pairs]


def run(args: argparse.Namespace) -> int:
    asked = request_from(vars(args))
    reading = Reading(tuple(args.read_model), args.calibration)
    if asked.models:
        host, planned = plans_from(asked, reading)
        if args.json:
            print(json.dumps(plan_doc.several(host, planned, secrets_from_env()), indent=2))
        else:
            print("\n\n".join(f"# {a.served_name}\n{render_table(p)}" for a, p in planned))
        return 0
    plan = plan_from(asked, reading)
    sized = capacity.size(plan)  # with --load: what it serves of it, and the hosts it needs
    if args.json:
        doc = plan_doc.one(plan, asked, secrets_from_env())
        print(json.dumps({**doc, **({"capacity": sized.to_dict()} if sized else {})}, indent=2))
    else:
        print(render_table(plan) + (render_capacity(sized) if sized else ""))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("plan", help="decide instances, cores, memory, KV cache")
    add_plan_options(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)
