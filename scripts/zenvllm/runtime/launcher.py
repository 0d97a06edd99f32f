"""The image's entrypoint: plan this container, check the runtime, exec `vllm serve`.

`docker run IMAGE --model DIR` alone serves with sane sizes: the planner runs
on the container's own cgroup and cpuset (one instance, this image's target)
and fills VLLM_CPU_KVCACHE_SPACE, VLLM_CPU_OMP_THREADS_BIND and the target's
tuning variables. Anything already in the environment (e.g. from a
deployment plan) wins. Standard library only: it runs before vLLM's imports.

Every line it logs starts with "zenvllm-launch:", on stderr.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zenvllm.core import deployed, gate
from zenvllm.core.accelerators import (
    installed,
    pace_state,
    platform_line,
    vllm_picks_zen,
    zentorch_state,
)
from zenvllm.core.errors import UserError
from zenvllm.core.host import Host
from zenvllm.core.topology import format_cpu_list, parse_cpu_list
from zenvllm.runtime import group, warm_start
from zenvllm.runtime.health import LISTEN_FILE

if TYPE_CHECKING:  # read_model is imported where a bare run plans, not at start-up
    from zenvllm.core.model import Model

MANIFEST = Path("/etc/zenvllm/image.json")
PREFIX = "zenvllm-launch:"


def log(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


# -- arguments ---------------------------------------------------------------
@dataclass(frozen=True)
class ServeArgs:
    model: str
    rest: list[str] = field(default_factory=list)  # everything else, for vllm serve

    def option(self, name: str) -> str | None:
        """The value of --name V or --name=V among the remaining args."""
        for i, arg in enumerate(self.rest):
            if arg == name and i + 1 < len(self.rest):
                return self.rest[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
        return None


def parse_args(argv: list[str]) -> ServeArgs:
    """Accept `--model M ...`, `M ...`, or either after a leading `serve`/`vllm serve`."""
    args = list(argv)
    if args[:2] == ["vllm", "serve"]:
        args = args[2:]
    elif args[:1] == ["serve"]:
        args = args[1:]
    model = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--model" and i + 1 < len(args):
            model = args[i + 1]
            i += 2
            continue
        if arg.startswith("--model="):
            model = arg.split("=", 1)[1]
        elif model is None and i == 0 and not arg.startswith("-"):
            model = arg  # vllm serve's own positional form
        else:
            rest.append(arg)
        i += 1
    if not model:
        raise UserError(
            "no model given: run the image with --model DIR (a model directory mounted "
            "into the container) or a model name, plus any `vllm serve` options"
        )
    return ServeArgs(model, rest)


def vllm_argv(serve: ServeArgs, port: str) -> list[str]:
    argv = ["vllm", "serve", serve.model, *serve.rest]
    if serve.option("--port") is None:
        argv += ["--port", port]
    return argv


# -- the plan ----------------------------------------------------------------
# vLLM's --dtype spellings, as the planner names them.
VLLM_DTYPES = {"bfloat16": "bfloat16", "float32": "float32", "float": "float32"}
VLLM_DTYPES |= {"float16": "float16", "half": "float16"}


def with_dtype(serve: ServeArgs, host: Host) -> ServeArgs:
    """The serve args with --dtype: the caller's, else what this CPU computes natively
    (the plan's notes say why)."""
    from zenvllm.core.dtype import serving_dtype

    if serve.option("--dtype") is not None:
        return serve
    return ServeArgs(serve.model, [*serve.rest, f"--dtype={serving_dtype(host).dtype}"])


def with_runner(serve: ServeArgs, model: Model | None) -> ServeArgs:
    """The serve args with --runner=pooling where the planned model pools, as a
    deployment's plan gives it (core/model.runner_of): vLLM's own auto would run a
    sentence-transformers model over a decoder as a generator. The caller's --runner
    stands; no model (the plan was refused) adds nothing."""
    from zenvllm.core.model import POOLING

    if model is None or model.runner != POOLING or serve.option("--runner") is not None:
        return serve
    log(f"runner pooling: {model.runner_why}")
    return ServeArgs(serve.model, [*serve.rest, "--runner=pooling"])


def plan_env(
    host: Host, serve: ServeArgs, target: str
) -> tuple[dict[str, str], list[str], int, Model]:
    """The env a one-instance plan of this container wants, its notes, shm MiB and the
    model as read."""
    from zenvllm.core.model import Model, read_model
    from zenvllm.core.plan import Policy, make_plan

    path = Path(serve.model)
    if (path / "config.json").is_file():
        model = read_model(path)
    else:
        model = Model(name=serve.model, weight_bytes=0)  # a hub name: size unknown
    max_len = serve.option("--max-model-len")
    given = serve.option("--dtype")
    policy = Policy(
        instances=1,
        target=target,
        # None: the planner's native choice, as with_dtype made; vLLM's auto: the config's
        dtype="auto" if given is None else VLLM_DTYPES.get(given, model.dtype),
        allow_inactive=True,  # zen or pace on another CPU serves, and says why below
        max_model_len=int(max_len) if max_len and max_len.isdigit() else None,
    )
    plan = make_plan(host, model, policy)
    instance = plan.instances[0]
    return dict(instance.env), [*plan.warnings, *plan.notes], instance.shm_size_mib, model


# vLLM 0.32's two shared-memory message queues take 10 x 16 MiB + 10 x 24 MiB
# (the second is not configurable); Docker's default /dev/shm is 64 MiB.
SHM_MIN_MIB = 512


def shm_problem(free_bytes: int | None, planned_mib: int) -> str | None:
    """Why /dev/shm is too small for vLLM to start, with the fix; None when it is fine."""
    if free_bytes is None or free_bytes >= SHM_MIN_MIB * 1024 * 1024:
        return None
    return (
        f"/dev/shm has {free_bytes // (1024 * 1024)} MiB free but vLLM needs at least "
        f"{SHM_MIN_MIB} MiB for its message queues; run the container with "
        f"--shm-size={max(planned_mib, SHM_MIN_MIB)}m (the plan's size) or --ipc=host"
    )


def bind_problem(bind: str, allowed: frozenset[int]) -> str | None:
    """Why an explicit VLLM_CPU_OMP_THREADS_BIND cannot work in this container; None when
    it can. Intel OpenMP skips CPUs outside the cpuset with a log warning and then runs
    unbound, so a stale or mistyped list would silently cost the binding."""
    if bind in ("", "auto", "nobind"):
        return None
    here = format_cpu_list(allowed)
    try:
        named = {cpu for rank in bind.split("|") for cpu in parse_cpu_list(rank)}
    except ValueError:
        named = set()
    if not named:
        return (
            f"VLLM_CPU_OMP_THREADS_BIND={bind!r} is not a CPU list; give one such as {here} "
            "(this container's CPUs), ranks split by '|', or auto, or leave it unset"
        )
    outside = named - allowed
    if outside:
        return (
            f"VLLM_CPU_OMP_THREADS_BIND={bind} names CPU(s) {format_cpu_list(outside)} outside "
            f"this container's CPUs {here}, which OpenMP would skip and then run unbound; "
            "bind within them or leave it unset for the planned binding"
        )
    return None


def shm_free(path: str = "/dev/shm") -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def shm_total_mib(path: str = "/dev/shm") -> int | None:
    try:
        return shutil.disk_usage(path).total // (1024 * 1024)
    except OSError:
        return None


def merge_env(env: dict[str, str], planned: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Planned values fill only what the environment leaves unset; say where each came from."""
    merged = dict(env)
    lines = []
    for key, value in planned.items():
        if env.get(key, "") != "":
            lines.append(f"{key}={env[key]} (from the environment; plan said {value})")
        else:
            merged[key] = value
            lines.append(f"{key}={value} (planned)")
    return merged, lines


# -- runtime checks ------------------------------------------------------------
def missing_preloads(ld_preload: str, exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    return [lib for lib in re.split(r"[:\s]+", ld_preload) if lib and not exists(lib)]


def read_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    """The image's own record of what it holds; {} outside an image."""
    data = gate.read_json(path, gate.SMALL, "rebuild the image", optional=True)
    return data if isinstance(data, dict) else {}


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens on host:port.

    vLLM would find out only after loading the model, then die with a traceback;
    the launcher says it before anything starts.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE  # anything else: vLLM reports it
    return False


def listen_record(command: list[str]) -> str:
    """What the HEALTHCHECK reads: "HOST PORT" of `vllm serve MODEL ...` (vLLM's defaults);
    a headless member of a pipeline serves nothing itself: its group's head is probed."""
    serve = ServeArgs(command[2], command[3:])
    host = serve.option("--master-addr") if "--headless" in serve.rest else serve.option("--host")
    return f"{host or '0.0.0.0'} {serve.option('--port') or '8000'}"


def group_port(command: list[str]) -> int | None:
    """The head's store port of a group started with --nnodes N > 1, else None."""
    serve = ServeArgs(command[2], command[3:])
    nodes, port = serve.option("--nnodes") or "1", serve.option("--master-port") or "29501"
    return int(port) if nodes.isdigit() and int(nodes) > 1 and port.isdigit() else None


def head_health(command: list[str]) -> str:
    """A headless member's head's /health URL ("" for the head itself)."""
    serve = ServeArgs(command[2], command[3:])
    if "--headless" not in serve.rest:
        return ""
    address, port = listen_record(command).split()
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/health"


def join_group(command: list[str], env: dict[str, str], store: int) -> None:
    """A member of a copy cut over hosts: gloo on the interface of this host's planned
    address (runtime/group.py says why)."""
    own = ServeArgs(command[2], command[3:]).option("--host") or ""
    nic = "GLOO_SOCKET_IFNAME" not in env and group.interface_of(own)
    if nic:
        env["GLOO_SOCKET_IFNAME"] = nic
        log(f"pipeline group: GLOO_SOCKET_IFNAME={nic} (the interface of {own})")


def check_port(command: list[str]) -> None:
    serve = ServeArgs(command[2], command[3:])
    if "--headless" in serve.rest:
        return  # it listens on no API port
    port, bind = serve.option("--port"), serve.option("--host") or "0.0.0.0"
    if port and port.isdigit() and port_taken(bind, int(port)):
        raise UserError(
            f"port {port} on {bind} is already in use (another instance or service listens "
            f"there): stop it, or give this container a free port with --port N "
            f"(a deployment: zenvllm_instances_base_port)"
        )


def log_state(active: bool, message: str, wanted: bool) -> None:
    """The accelerator's state; loud when the image's own accelerator is off."""
    log(message if active or not wanted else f"WARNING: {message}")


# -- main ----------------------------------------------------------------------
def check_deployed(env: dict[str, str], host: Host, target: str) -> int:
    """A deployment applied a plan: check this container against it; the plan's shm MiB."""
    promise = deployed.decode(env[deployed.ENV_KEY])
    found = deployed.differences(
        promise, host, shm_total_mib(env.get("ZENVLLM_SHM", "/dev/shm")), target
    )
    if found:
        log(
            f"WARNING: this container differs from the deployment's plan for {promise.name}: "
            + "; ".join(found)
        )
    else:
        log(f"validated the deployment's plan for {promise.name}: no differences")
    for key in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"):
        log(f"{key}={env.get(key, '(unset)')} (the deployment's plan)")
    return promise.shm_mib


def plan_here(
    env: dict[str, str], host: Host, serve: ServeArgs, target: str
) -> tuple[int, Model | None]:
    """A bare `docker run`: plan this container and fill what the env leaves unset; its
    shm MiB and the model as read (None when the plan was refused)."""
    model: Model | None
    try:
        planned, notes, shm_mib, model = plan_env(host, serve, target)
    except UserError as err:
        if env.get("VLLM_CPU_KVCACHE_SPACE") and env.get("VLLM_CPU_OMP_THREADS_BIND"):
            log(f"plan refused ({err}); going on with the sizes given in the environment")
            planned, notes, shm_mib, model = {}, [], SHM_MIN_MIB, None
        else:
            raise
    for note in notes:
        log(f"plan: {note}")
    merged, lines = merge_env(env, planned)
    env.clear()
    env.update(merged)
    for line in lines:
        log(line)
    return shm_mib, model


def prepare(
    argv: list[str], env: dict[str, str], host: Host, manifest: dict[str, Any]
) -> list[str]:
    """Everything but the exec: logs, env updates in place, the argv for vLLM."""
    serve = parse_args(argv)
    target = env.get("ZENVLLM_TARGET") or manifest.get("target") or "vllm-openai"
    log(f"target {target}; model {serve.model}")
    log(
        f"cpus {','.join(str(c) for c in sorted(host.allowed_cpus))}; vendor {host.vendor or '?'};"
        f" isa {' '.join(sorted(host.isa)) or 'none'}"
    )
    asked, serve = serve, with_dtype(serve, host)
    if env.get(deployed.ENV_KEY):
        shm_mib = check_deployed(env, host, target)
    else:
        shm_mib, model = plan_here(env, host, asked, target)
        serve = with_runner(serve, model)

    problem = bind_problem(env.get("VLLM_CPU_OMP_THREADS_BIND", ""), host.allowed_cpus)
    problem = problem or shm_problem(shm_free(env.get("ZENVLLM_SHM", "/dev/shm")), shm_mib)
    if problem:
        raise UserError(problem)

    missing = missing_preloads(env.get("LD_PRELOAD", ""))
    if missing:
        raise UserError(
            f"LD_PRELOAD names missing libraries: {', '.join(missing)}; "
            "install them or remove them from LD_PRELOAD"
        )
    log(f"LD_PRELOAD ok: {env.get('LD_PRELOAD') or '(empty)'}")
    log(warm_start.use_compile_cache(env))

    pace_active = False
    zentorch = installed("zentorch")
    if target == "zen" or zentorch:
        log_state(*zentorch_state(host, zentorch, installed("torch")), target == "zen")
    pace = installed("pace-vllm")
    if target == "pace" or pace:
        spec = manifest.get("matrix", {}).get("pace-vllm", {}).get("needs", {}).get("vllm", "")
        pace_active, message = pace_state(host, pace, installed("vllm"), spec or ">=0.25,<=0.28")
        log_state(pace_active, message, target == "pace")
    log(platform_line(host, vllm_picks_zen(host, zentorch), pace_active))

    if (Path(serve.model) / "config.json").is_file():
        env.setdefault("HF_HUB_OFFLINE", "1")  # a local model needs no hub
    port = serve.option("--port") or env.get("ZENVLLM_PORT") or str(manifest.get("port", 8000))
    return vllm_argv(serve, port)


def main(argv: list[str] | None = None) -> int:
    from zenvllm.core.topology import read_host
    from zenvllm.runtime import amx

    argv = sys.argv[1:] if argv is None else argv
    env = dict(os.environ)
    try:
        host = read_host(Path(env.get("ZENVLLM_ROOT", "/")))
        command = prepare(argv, env, host, read_manifest())
        check_port(command)
    except UserError as err:
        log(f"error: {err}")
        return 2
    # The image's .pth hook asked at this interpreter's start; vLLM's processes ask again.
    tiles = amx.AT_START or amx.request()
    log(amx.describe(tiles, "amx_tile" in host.flags, amx.AT_START is not None))
    if env.get("ZENVLLM_DRY_RUN", "") not in ("", "0"):
        log("dry run (ZENVLLM_DRY_RUN): would exec " + " ".join(command))
        return 0
    with contextlib.suppress(OSError):
        LISTEN_FILE.write_text(listen_record(command))
    store = group_port(command)
    if store:
        join_group(command, env, store)
        if os.getpid() == 1:  # a container's init: what the watch ends stays inside it
            head = head_health(command)
            also = f" and its head's {head}" if head else ""
            log(f"pipeline group: watching its store port {store}{also} (runtime/group.py)")
            log("run " + " ".join(command))
            return group.supervise(command, env, store, head_url=head)
    log("exec " + " ".join(command))
    os.execvpe(command[0], command, env)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
