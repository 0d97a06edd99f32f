"""One instance's container, decided once: everything `docker run` needs.

`container_of(instance, request)` turns a planned instance plus a deployment's
request (image, model mount, served name, security profile, supervisor) into the
complete specification: name, image, command, env, placement, security, mounts,
labels, restart policy and the config hash that tells a current container from an
out-of-date one. `zenvllm plan --json` emits it for every instance; Ansible writes
it out as the unit, the run script and the env file without computing anything.
Pure; standard library only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from zenvllm.core import compile_cache, group_guard, speculation
from zenvllm.core.errors import PlanError
from zenvllm.core.request import Request
from zenvllm.core.topology import format_cpu_list


class Instance(Protocol):
    """What the contract reads of a planned instance (core/plan.py's Instance)."""

    @property
    def name(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def port(self) -> int: ...
    @property
    def cpus(self) -> tuple[int, ...]: ...
    @property
    def mems(self) -> tuple[int, ...]: ...
    @property
    def shm_size_mib(self) -> int: ...
    @property
    def memory_limit_mib(self) -> int: ...
    @property
    def env(self) -> dict[str, str]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def runner(self) -> str: ...
    @property
    def tensor_parallel_size(self) -> int: ...
    @property
    def pipeline_parallel_size(self) -> int: ...


# The least privilege vLLM's CPU backend needs: SYS_NICE for its NUMA memory binding
# (with a seccomp profile that allows the memory-policy calls), nothing else.
SECURITY = ("--cap-drop=ALL", "--cap-add=SYS_NICE", "--security-opt=no-new-privileges")
# Who restarts a stopped instance, and the engine's restart policy that follows: systemd
# runs it in the foreground; "engine" restarts it; "none" (a benchmark's short-lived
# server, never an operator's choice) leaves it detached and stopped when it stops.
SUPERVISORS = {"systemd": "no", "engine": "unless-stopped", "none": "no"}

# vLLM 0.32 on CPU allocates a later stage's activation buffers in the compile warm-up,
# which --enforce-eager skips: the first request then fails in the worker
# (AssertionError: intermediate_tensors is not None) and hangs.
EAGER_PIPELINE = (
    "vLLM 0.32 on CPU fails the first request of a pipeline without its compile warm-up"
)


# How long the head of a copy cut over hosts waits for one step of its stages before its
# engine fails (vLLM's VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, 300 s by default). A stage
# that hangs (stopped, stuck, or cut off by a network that drops its packets without a
# reset) keeps every connection of the group up, so only this timeout notices: the head's
# vLLM then ends, requests in flight get an error, and its supervisor restarts the group.
# 120 s: well over a step of the models the tests and benchmarks split (well under 1 s on
# 2 cores), and under vLLM's 300 s. A step longer than this (a long prefill chunk of a very
# large model on few cores) needs a larger value in extra_env.
STAGE_STEP_TIMEOUT_S = 120


def secrets_digest(secrets: dict[str, str]) -> str:
    """The env file's secrets never enter the plan, only their digest: a new key must
    still change the config hash and restart the instances ("" for none)."""
    given = {k: v for k, v in sorted(secrets.items()) if v}
    return hashlib.sha256(json.dumps(given).encode()).hexdigest()[:16] if given else ""


@dataclass(frozen=True)
class Container:
    name: str
    address: str
    port: int
    image: str
    served_model_name: str
    options: tuple[str, ...]  # `docker run` options, the config label included
    command: tuple[str, ...]  # the image's arguments (the launcher passes them to vLLM)
    env: dict[str, str]  # the env file's content, secrets aside
    env_file: str
    run_script: str  # what the engine-supervised deployment runs
    unit: str  # systemd's name for it
    unit_file: str
    config_hash: str
    restart: str  # the engine's restart policy
    foreground: bool  # systemd's: in the foreground, removed when it stops
    cache_dir: str = ""  # the host directory mounted at compile_cache.CONTAINER_DIR (vLLM's)
    # A copy cut over hosts: the head's torch.distributed store port (0: a whole copy),
    # and the head's address when this is a headless stage, which serves nothing itself.
    group_port: int = 0
    head: str = ""
    # The cgroup every container of that copy's group runs in, which the firewall closes
    # to all but the group's peers (core/group_guard.py); None for a whole copy.
    guard: group_guard.GroupGuard | None = None

    @property
    def run_args(self) -> list[str]:
        """`docker run ...` after the binary."""
        how = ["--rm"] if self.foreground else ["--detach", f"--restart={self.restart}"]
        return ["run", *how, *self.options, self.image, *self.command]

    @property
    def env_text(self) -> str:
        """The env file without secrets (Ansible's template adds the header and secrets)."""
        return "".join(f"{key}={value}\n" for key, value in sorted(self.env.items()))

    @property
    def serves(self) -> bool:
        """Whether it answers the API itself (a headless stage does not)."""
        return not self.head

    @property
    def url(self) -> str:
        """Where a router or a scraper reaches it; a headless stage's group is reached
        at its head, so its health is the group's."""
        address = self.head or self.address
        host = f"[{address}]" if ":" in address else address
        return f"http://{host}:{self.port}"

    @property
    def files(self) -> list[str]:
        """Every file a deployment writes for this instance (and refuses to take over)."""
        return [self.env_file, self.run_script, self.unit_file]

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "run_args": self.run_args,
            "files": self.files,
            "url": self.url,
            "serves": self.serves,
        }


def placement(instance: Instance) -> list[str]:
    """Where the plan put the instance: its cores, memory node, memory and shm."""
    return [
        f"--cpuset-cpus={format_cpu_list(instance.cpus)}",
        f"--cpuset-mems={format_cpu_list(instance.mems)}",
        f"--shm-size={instance.shm_size_mib}m",
        f"--memory={instance.memory_limit_mib}m",
    ]


def stage_args(instance: Instance, request: Request) -> list[str]:
    """vLLM's multi-node launch for this host's stage of a copy cut over hosts: the head
    (host rank 0) serves, the others join it headless at the head's address and port."""
    p, rank = instance.pipeline_parallel_size, request.host_rank
    if p == 1:
        return []
    if rank >= p:
        raise PlanError(
            f"host rank {rank}: {instance.name} has {p} pipeline stages, one per host; give "
            f"this host's stage, 0 to {p - 1}"
        )
    if rank > 0 and not request.head_address:
        raise PlanError(
            f"host rank {rank} of {instance.name} joins its head: give the head host's "
            "address (head_address, --head-address)"
        )
    if "--enforce-eager" in request.serve_args:
        raise PlanError(
            f"{instance.name} is cut into {p} pipeline stages and serve_args has "
            f"--enforce-eager: {EAGER_PIPELINE}; remove --enforce-eager"
        )
    port = head_port(instance, request)
    if port > 65535:
        raise PlanError(f"head port {port} of {instance.name} runs past 65535; lower head_port")
    return [
        f"--pipeline-parallel-size={p}",
        f"--nnodes={p}",
        f"--node-rank={rank}",
        f"--master-addr={request.head_address or request.address}",
        f"--master-port={port}",
        *(["--headless"] if rank > 0 else []),
    ]


def head_port(instance: Instance, request: Request) -> int:
    """The port a pipeline's head listens on for its hosts (torch.distributed's store)."""
    return request.head_port + instance.index


def env_of(instance: Instance, request: Request) -> dict[str, str]:
    """The env file's content, secrets aside: the plan's env, the request's over it."""
    env = {**instance.env, "HF_HUB_OFFLINE": "1", **request.extra_env}
    if instance.pipeline_parallel_size > 1:
        # The address the group's hosts reach this one on: vLLM's head announces its
        # message queue there, and falls back to 0.0.0.0 (which the other hosts take for
        # themselves: the group hangs) where no default route names one.
        env.setdefault("VLLM_HOST_IP", request.address)
        env.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(STAGE_STEP_TIMEOUT_S))
    return env


def command_of(instance: Instance, request: Request, stage: list[str]) -> list[str]:
    """The image's arguments, which the launcher passes to `vllm serve`."""
    return [
        f"--model={request.container_model_dir}",
        f"--served-model-name={request.served_name}",
        f"--host={request.address}",
        f"--port={instance.port}",
        *([f"--max-model-len={request.max_model_len}"] if request.max_model_len else []),
        f"--dtype={instance.dtype}",
        *([f"--runner={instance.runner}"] if instance.runner != "generate" else []),
        *(
            [f"--tensor-parallel-size={instance.tensor_parallel_size}"]
            if instance.tensor_parallel_size > 1
            else []
        ),
        *stage,
        *speculation.decide(
            request.speculation, instance.runner, split_copy(instance)
        ).serve_args(),
        *request.serve_args,
    ]


def split_copy(instance: Instance) -> bool:
    return instance.tensor_parallel_size > 1 or instance.pipeline_parallel_size > 1


def cache_dir_of(
    instance: Instance, request: Request, command: list[str], env: dict[str, str]
) -> str:
    """The host directory of the instance's compile cache, by its key ("" for none)."""
    if not request.compile_cache_dir:
        return ""
    key = compile_cache.key(f"{request.image}@{request.image_id}", command, env)
    return compile_cache.host_dir(request.compile_cache_dir, instance.name, key)


def options_of(
    instance: Instance,
    request: Request,
    env_file: str,
    cache: str,
    guard: group_guard.GroupGuard | None,
) -> list[str]:
    """`docker run`'s options but the config label: name, placement, security, mounts,
    labels."""
    name = instance.name
    return [
        f"--name={name}",
        "--network=host",
        *placement(instance),
        f"--user={request.user}",
        *SECURITY,
        *([f"--security-opt=seccomp={request.seccomp_profile}"] if request.seccomp_profile else []),
        f"--env-file={env_file}",
        f"--volume={request.model_dir}:{request.container_model_dir}:ro",
        *([f"--volume={cache}:{compile_cache.CONTAINER_DIR}"] if cache else []),
        "--label=zenvllm.managed=true",
        f"--label=zenvllm.deployment={request.deployment}",
        f"--label=zenvllm.instance={name}",
        f"--label=zenvllm.port={instance.port}",
        f"--label=zenvllm.image-id={request.image_id}",
        # The plan, for checking the instance after launch (core/observed.py).
        f"--label=zenvllm.cpus={format_cpu_list(instance.cpus)}",
        f"--label=zenvllm.mems={format_cpu_list(instance.mems)}",
        f"--label=zenvllm.target={request.target}",
        *([f"--cgroup-parent={guard.parent}"] if guard else []),
        *request.extra_docker_args,
    ]


def container_of(instance: Instance, request: Request, secrets: str = "") -> Container:
    """The container of one planned instance (a plan.Instance) as the request asks, its
    supervisor decided (not auto); `secrets` is their digest."""
    if request.supervisor not in SUPERVISORS:
        raise ValueError(f"supervisor {request.supervisor!r}: decide it before planning")
    name = instance.name
    env_file = f"{request.config_dir}/{name}.env"
    env = env_of(instance, request)
    stage = stage_args(instance, request)  # [] for a copy on one host
    command = command_of(instance, request, stage)
    cache = cache_dir_of(instance, request, command, env)
    guard = (
        group_guard.guard_of(
            request.deployment, request.cgroup2_mount, request.cgroup_driver, request.supervisor
        )
        if stage
        else None
    )
    options = options_of(instance, request, env_file, cache, guard)
    # Everything that shapes the container, the env file (secrets by digest) included:
    # a container whose label differs is out of date and gets replaced.
    shape = [options, request.image, command, sorted(env.items()), secrets]
    config_hash = hashlib.sha1(json.dumps(shape).encode()).hexdigest()
    return Container(
        name=name,
        address=request.address,
        port=instance.port,
        image=request.image,
        served_model_name=request.served_name,
        options=(*options, f"--label=zenvllm.config={config_hash}"),
        command=tuple(command),
        env=env,
        env_file=env_file,
        run_script=f"{request.config_dir}/{name}.run.sh",
        unit=f"{name}.service",
        unit_file=f"{request.unit_dir}/{name}.service",
        config_hash=config_hash,
        restart=SUPERVISORS[request.supervisor],
        foreground=request.supervisor == "systemd",
        cache_dir=cache,
        group_port=head_port(instance, request) if stage else 0,
        head=request.head_address if stage and request.host_rank > 0 else "",
        guard=guard,
    )
