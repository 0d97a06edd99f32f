"""A deployment request: every option the planner is asked, written once.

`Request` holds each option with its type (its default's), its default, its limits and
one line of help (core/options.py's `Spec`, in the field's metadata). `zenvllm plan`'s
flags are made from it (runtime/commands_plan.py), and so is the instances role's view of it
(deploy/role_instances.py: each option under its role name with the role's own defaults,
plus the options only the role uses), from which `python -m zenvllm.reference` writes
the role's defaults, argument specs and request template and the variable reference.
The role hands the planner the request as one JSON value (`zenvllm plan --request
JSON`), checked here field by field through the gate; a name that is not a field here
(the role's own options included) is refused.

Nothing here knows how a role spells, defaults or templates an option. Pure; standard
library only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

from zenvllm.core import gate, group_guard, model_list
from zenvllm.core.arguments import NAME, is_ip
from zenvllm.core.dtype import CHOICES as DTYPES
from zenvllm.core.flavors import PRESETS
from zenvllm.core.options import FIX, VALIDATORS, Spec, kind_of, option
from zenvllm.core.performance import LOAD_EXAMPLE, SLO_EXAMPLE, parse_load, parse_slo
from zenvllm.core.speculation import CHOICES as SPECULATION
from zenvllm.core.speculation import FLAG as SPECULATIVE_FLAG
from zenvllm.core.targets import TARGETS

LAYOUTS = ("contiguous", "interleaved")
SUPERVISORS = ("auto", "systemd", "engine")


MODEL, DEPLOY, HOST, IMAGE, SUPERVISE, PATHS = (
    "The model",
    "The deployment",
    "The host the plan is for",
    "The image and each container",
    "Supervision and the engine",
    "Where things go on the host",
)


@dataclass(frozen=True)
class Request:
    # -- the model
    model_dir: str = option(
        "",
        "The model directory on the host (config.json, safetensors), mounted read-only.",
        MODEL,
        flag="--model",
        exclusive="model",
        path=True,
    )
    served_model_name: str = option(
        "", 'The model name clients ask for ("" = the model directory\'s name).', MODEL
    )
    models: tuple[str, ...] = option(
        (),
        "Several models on the host, each NAME=DIR (NAME the name clients ask for, DIR its "
        "directory on the host), each planned on cores of its own and served behind one "
        "endpoint; [] = model_dir alone.",
        MODEL,
        example='["chat=/srv/models/qwen", "embed=/srv/models/minilm"]',
    )
    shares: tuple[str, ...] = option(
        (),
        "With several models, a model's share of the host: NAME=cores:N physical cores or "
        "NAME=weight:W (default: in proportion to its weight bytes).",
        MODEL,
        example='["embed=cores:2", "chat=weight:3"]',
    )
    model_size_gib: float = option(
        0.0,
        "Plan from this weight size in GiB instead of reading model_dir (0 = read it).",
        MODEL,
        flag="--model-size-gib",
        exclusive="model",
        low=0,
        high=1 << 20,
        example="16",
    )
    dtype: str = option(
        "auto",
        "The dtype vLLM serves in: auto is what the CPU computes natively (bfloat16 with "
        "AVX512-BF16 or AMX, float32 elsewhere); the weights and KV cache are sized in it.",
        MODEL,
        flag="--dtype",
        choices=DTYPES,
    )
    speculation: str = option(
        "auto",
        "Speculative decoding: ngram (prompt lookup, 4 tokens: twice as fast per token one "
        "request at a time, slower for many at once unless answers quote their prompts) or "
        "off; auto leaves it off, as measured for a server shared by many clients "
        "(core/speculation.py).",
        MODEL,
        flag="--speculation",
        choices=SPECULATION,
    )
    max_model_len: int = option(
        0,
        "The context length vLLM serves (0 = the model's own); more than the model takes "
        "(its positions, an encoder's max_seq_length) is refused.",
        MODEL,
        flag="--max-model-len",
        low=0,
        high=1 << 24,
        example="4096",
    )
    # -- the deployment
    deployment: str = option(
        "zenvllm",
        "The deployment's name: instances are <deployment>-0, -1, ...; only its own "
        "containers are pruned (several deployments can share one engine).",
        DEPLOY,
        flag="--deployment",
        pattern=NAME,  # the rule of core/arguments.py's name
        example="zenvllm",
    )
    count: str | int = option(
        "auto",
        "Number of instances: auto (the planner decides from NUMA nodes and cores) or N.",
        DEPLOY,
        flag="--instances",
        auto=True,
        low=1,
        example="2",
    )
    tensor_parallel: str | int = option(
        "auto",
        "Ranks per copy of the model, one per NUMA node (vLLM's tensor parallel): auto "
        "splits a copy only when it fits no node; N (a power of two) splits every copy "
        "N ways, for lower latency.",
        DEPLOY,
        flag="--tensor-parallel",
        auto=True,
        low=1,
        example="2",
    )
    hosts: int = option(
        1,
        "Hosts of this kind one copy of the model may be cut over, one pipeline stage per "
        "host (vLLM's pipeline parallel): used only when no single host holds a copy.",
        DEPLOY,
        flag="--hosts",
        low=1,
        high=4096,
        example="2",
    )
    host_rank: int = option(
        0,
        "This host's stage in its copy's pipeline: 0 is the head, which serves; the "
        "others join it headless (vLLM's --node-rank). deploy.yml gives each host its "
        "place in pipeline_hosts.",
        DEPLOY,
        flag="--host-rank",
        low=0,
        high=4095,
        example="1",
    )
    head_address: str = option(
        "",
        "The pipeline head's address the other hosts join (vLLM's --master-addr); \"\" = "
        "this host's address. deploy.yml gives the private address of the first of "
        "pipeline_hosts.",
        DEPLOY,
        flag="--head-address",
        ip=True,
        example="10.0.0.11",
    )
    head_port: int = option(
        29500,
        "The port the head's instance 0 listens on for its pipeline's hosts (vLLM's "
        "--master-port); instance i uses head_port + i.",
        DEPLOY,
        low=1024,
        high=65535,
        example="29500",
    )
    target: str = option(
        "vllm-openai",
        "The image target the plan tunes the environment for.",
        DEPLOY,
        flag="--target",
        choices=tuple(TARGETS),
    )
    allow_inactive: bool = option(
        False,
        "Plan zen or pace on a CPU that cannot accelerate them (they serve as vllm-openai, "
        "with a warning in the plan and each instance's log); false refuses.",
        DEPLOY,
        flag="--allow-inactive",
    )
    layout: str = option(
        "contiguous",
        "Cores of an instance side by side (L3-packed) or every k-th (interleaved).",
        DEPLOY,
        flag="--layout",
        choices=LAYOUTS,
    )
    base_port: int = option(
        8001,
        "Port of the first instance; the next ones count up.",
        DEPLOY,
        flag="--base-port",
        low=1,
        high=65535,
        example="8001",
    )
    address: str = option(
        "127.0.0.1",
        "Where the instances listen: loopback behind the host's gateway; behind a router "
        "the host's private address.",
        DEPLOY,
    )
    kv_cache_gib: int = option(
        0,
        "KV cache per instance in GiB (0 = the planner sizes it).",
        DEPLOY,
        flag="--kv-cache-gib",
        low=0,
        high=1 << 20,
        example="4",
    )
    kv_fraction: float = option(
        0.9,
        "Share of a node's leftover memory the planner gives to KV caches.",
        DEPLOY,
        flag="--kv-fraction",
        low=0,
        high=1,
        above=True,
        example="0.9",
    )
    load: str = option(
        "",
        "The load to size for: concurrency=N clients (or rate=R requests/s), in=P and out=O "
        "tokens each; the plan says what it serves of it and how many hosts of this kind it "
        'needs (core/performance.py predicts; "" = none).',
        DEPLOY,
        flag="--load",
        example=LOAD_EXAMPLE,
        parse=parse_load,
    )
    slo: str = option(
        "",
        "The target at that load: tpot_ms=X (time per output token), ttft_ms=Y (time to "
        "the first), user_tok_s=Z (tokens per second each user reads), any of them; a "
        'target no number of such hosts meets is refused ("" = none).',
        DEPLOY,
        flag="--slo",
        example=SLO_EXAMPLE,
        parse=parse_slo,
    )
    # -- the host the plan is for
    sysfs_root: str = option(
        "/",
        'Read sysfs/procfs under this directory ("/" = this host; tests use fixture trees).',
        HOST,
        flag="--root",
        exclusive="host",
        path=True,
    )
    flavor: str = option(
        "",
        f"Plan a synthetic host instead: {', '.join(PRESETS)} or "
        "vcpus=N,ram_gib=N[,numa=N][,smt=1|2][,cpu=NAME].",
        HOST,
        flag="--flavor",
        exclusive="host",
    )
    # -- the image and each container
    image: str = option(
        "zenvllm/vllm-openai:0.32.0",
        "The image (a tag); the image role resolves its ID.",
        IMAGE,
    )
    image_id: str = option(
        "unknown",
        "The image's ID, on each container's label (a new ID restarts them); the image "
        "role sets it.",
        IMAGE,
    )
    user: str = option("10001:10001", "The image's non-root runtime user.", IMAGE)
    container_model_dir: str = option(
        "/model", "Where the model appears in the container.", IMAGE, path=True
    )
    serve_args: tuple[str, ...] = option(
        (),
        "More arguments for `vllm serve`, after the model, host, port and dtype (set the "
        "dtype with dtype, not here).",
        IMAGE,
    )
    extra_env: dict[str, str] = option(  # noqa: RUF009 (a fresh {} per request)
        {}, "More environment for every instance (not secret; it is in the env file).", IMAGE
    )
    extra_docker_args: tuple[str, ...] = option(
        (), "More `docker run` arguments (e.g. more read-only mounts).", IMAGE
    )
    # -- supervision and the engine
    supervisor: str = option(
        "auto",
        "Who restarts an instance: systemd units, or the engine's restart policy; auto "
        "picks systemd where it is PID 1.",
        SUPERVISE,
        choices=SUPERVISORS,
    )
    cgroup_driver: str = option(
        "auto",
        "How the engine names a container's cgroup parent (a copy cut over hosts runs its "
        "containers in one cgroup, core/group_guard.py): systemd (a slice) or cgroupfs (a "
        "path); auto asks the engine on the host.",
        SUPERVISE,
        choices=group_guard.DRIVERS,
    )
    cgroup2_mount: str = option(
        "auto",
        'Where the cgroup v2 hierarchy is, under /sys/fs/cgroup: "" (a v2 host), "unified" '
        '(a hybrid host) or "none"; auto reads the host.',
        SUPERVISE,
        choices=group_guard.MOUNTS,
    )
    # -- where things go on the host
    config_dir: str = option(
        "/etc/zenvllm", "Where each instance's env file and run script go.", PATHS, path=True
    )
    unit_dir: str = option(
        "/etc/systemd/system", "Where the instances' systemd units go.", PATHS, path=True
    )
    seccomp_profile: str = option(
        "/etc/zenvllm/seccomp-numa.json",
        "The seccomp profile (the engine's default plus the NUMA memory-policy calls; "
        '"" = the engine\'s default).',
        PATHS,
        path=True,
    )
    compile_cache_dir: str = option(
        "/var/cache/zenvllm/compile",
        "vLLM's compile cache, a directory per instance and key: a restart loads the "
        'compiled model ("" = none; every start compiles).',
        PATHS,
        path=True,
    )

    # -- what the planner reads of it

    @property
    def instances(self) -> int | None:
        """count as the planner takes it: None for auto."""
        return None if self.count == "auto" else int(self.count)

    @property
    def tensor_parallel_size(self) -> int | None:
        """tensor_parallel as the planner takes it: None for auto."""
        return None if self.tensor_parallel == "auto" else int(self.tensor_parallel)

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model_dir.rstrip("/").rsplit("/", 1)[-1] or "model"


DEFAULT = Request()


def specs() -> Iterator[tuple[str, Spec, Any]]:
    """Every option, in order: name, spec, default."""
    for f in fields(Request):
        yield f.name, f.metadata["spec"], getattr(DEFAULT, f.name)


def spec_of(name: str) -> Spec:
    spec: Spec = Request.__dataclass_fields__[name].metadata["spec"]
    return spec


def kind(name: str) -> str:
    """str, int, float, bool, list, dict or count: how the option is typed everywhere."""
    return kind_of(spec_of(name), getattr(DEFAULT, name))


def check(name: str, value: Any, where: str) -> Any:
    """One option's value, typed and limited as its Spec says (an InputError naming
    `where`, the value, the limit and the fix otherwise)."""
    spec = spec_of(name)
    fix = f"give {spec.example or 'a value as its help says'}; {FIX}"
    return VALIDATORS[kind(name)](spec, value, where, fix)


def several_checked(asked: Request, where: str) -> Request:
    """Several models: good entries and shares, and nothing of the one-model options (a
    load and an SLO among them); an SLO only with a load."""
    model_list.checked(asked.models, asked.shares, where)
    one = [n for n in ("model_dir", "served_model_name", "model_size_gib") if getattr(asked, n)]
    if asked.models and one:
        raise gate.InputError(
            f"{where}: models names each model as NAME=DIR, and {one[0]} is given too; give "
            f"one model with {one[0]}, or several with models alone"
        )
    if asked.models and (asked.load or asked.slo):
        raise gate.InputError(
            f"{where}: load and slo size one model's hosts, and several models are given; "
            "size each model alone (one model, with load and slo)"
        )
    if asked.slo and not asked.load:
        raise gate.InputError(
            f"{where}: slo {asked.slo} is met or missed at a load, and no load is given; "
            f"give load (--load) too, e.g. {LOAD_EXAMPLE}"
        )
    if asked.models and asked.hosts > 1:
        raise gate.InputError(
            f"{where}: hosts is {asked.hosts}, and a copy cut over hosts serves one model; "
            "plan several models on one host each (hosts 1), or one model over hosts"
        )
    return asked


def from_json(text: str, source: str = "--request") -> Request:
    """A request from JSON: each field checked by its Spec; a key that is not a field
    refused by name; the address must be an IP address."""
    asked = [n for n, _, _ in specs()]
    fix = f"give a JSON object with some of: {', '.join(asked)}"
    given = gate.obj(gate.parse_json(text, source, fix), source, fix)
    for key in given:
        if key not in asked:
            raise gate.InputError(f"{source}: {key[:40]!r} is not an option of a request; {fix}")
    request = replace(DEFAULT, **{k: check(k, v, f"{source}: {k}") for k, v in given.items()})
    if any(a == "--dtype" or a.startswith("--dtype=") for a in request.serve_args):
        raise gate.InputError(
            f"{source}: serve_args names --dtype, which the plan sets; give dtype instead "
            f"({', '.join(DTYPES)}; auto serves what the CPU computes natively)"
        )
    if request.speculation == "ngram" and any(
        a == SPECULATIVE_FLAG or a.startswith(f"{SPECULATIVE_FLAG}=") for a in request.serve_args
    ):
        raise gate.InputError(
            f"{source}: speculation ngram and serve_args' {SPECULATIVE_FLAG} both set it; "
            "give one of them"
        )
    several_checked(request, source)
    if not is_ip(request.address):
        raise gate.InputError(
            f"{source}: address {request.address!r} is not an IP address; give 127.0.0.1 "
            "(behind the host's gateway) or the host's private address (behind a router)"
        )
    return request
