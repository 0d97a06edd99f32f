"""One instance's container, decided once: everything `docker run` needs.

`container_of(instance, settings)` turns a planned instance plus a deployment's
settings (image, model mount, served name, security profile, supervisor) into the
complete specification: name, image, command, env, placement, security, mounts,
labels, restart policy and the config hash that tells a current container from an
out-of-date one. `zenvllm plan --json` emits it for every instance; Ansible writes
it out as the unit, the run script and the env file without computing anything.
Pure; standard library only.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import asdict, dataclass, field

from zenvllm.core import compile_cache, gate
from zenvllm.core.errors import UserError
from zenvllm.core.topology import format_cpu_list

# The least privilege vLLM's CPU backend needs: SYS_NICE for its NUMA memory binding
# (with a seccomp profile that allows the memory-policy calls), nothing else.
SECURITY = ("--cap-drop=ALL", "--cap-add=SYS_NICE", "--security-opt=no-new-privileges")
# Who restarts a stopped instance, and the engine's restart policy that follows.
SUPERVISORS = {"systemd": "no", "engine": "unless-stopped", "none": "no"}


def typed(value: object, like: object, where: str, fix: str) -> object:
    """`value` as the type of `like` (a field's default), through the gate's checks."""
    if isinstance(like, str):
        return gate.text(value, where, fix)
    if isinstance(like, int):
        return gate.whole(value, where, 0, 1 << 31, fix)
    if isinstance(like, tuple):
        return tuple(
            gate.text(v, f"{where}[{i}]", fix) for i, v in enumerate(gate.items(value, where, fix))
        )
    return {
        k: gate.text(v, f"{where}.{k[:40]}", fix) for k, v in gate.obj(value, where, fix).items()
    }


@dataclass(frozen=True)
class Settings:
    """A deployment's choices that are not sizing (Ansible's role variables)."""

    deployment: str = "zenvllm"
    image: str = "zenvllm/vllm-openai:0.32.0"
    image_id: str = "unknown"
    model_dir: str = "/srv/models/model"  # on the host, mounted read-only
    container_model_dir: str = "/model"
    served_model_name: str = ""  # "" = the model directory's name
    max_model_len: int = 0  # 0 = the model's own
    serve_args: tuple[str, ...] = ("--dtype=bfloat16",)
    user: str = "10001:10001"
    seccomp_profile: str = ""  # "" = the engine's default profile
    config_dir: str = "/etc/zenvllm"  # where the env file and run script live
    unit_dir: str = "/etc/systemd/system"
    # systemd runs it in the foreground; "engine" restarts it; "none" (a benchmark's
    # short-lived server) leaves it detached and stopped when it stops.
    supervisor: str = "systemd"
    extra_env: dict[str, str] = field(default_factory=dict)
    extra_options: tuple[str, ...] = ()
    # Where vLLM listens: loopback behind the host's own gateway; the host's private
    # address behind a fleet router (which, with a firewall and the key, alone reaches it).
    address: str = "127.0.0.1"
    # Host directory under which each instance keeps vLLM's compile cache
    # (ROOT/INSTANCE/KEY, core/compile_cache.py); "" = none, every start compiles.
    compile_cache_dir: str = ""
    secrets_digest: str = ""

    @classmethod
    def from_json(cls, text: str, secrets: dict[str, str] | None = None) -> Settings:
        """Settings from JSON, each field checked against its default's type (unknown
        keys refused by name), plus the secrets' digest."""
        fix = f"give a JSON object with some of: {', '.join(cls.__dataclass_fields__)}"
        fields = gate.obj(gate.parse_json(text, "--deployment-json", fix), "--deployment-json", fix)
        defaults = cls()
        for key in fields:
            if key not in cls.__dataclass_fields__:
                raise gate.InputError(f"--deployment-json: {key[:40]!r} is not a setting; {fix}")
        settings = cls(
            **{
                key: typed(value, getattr(defaults, key), f"--deployment-json: {key}", fix)
                for key, value in fields.items()
            }
        )
        try:
            ipaddress.ip_address(settings.address)
        except ValueError:
            raise UserError(
                f"--deployment-json: address {settings.address!r} is not an IP address; give "
                "127.0.0.1 (behind the host's gateway) or the host's private address (behind "
                "a router)"
            ) from None
        cache = settings.compile_cache_dir
        if cache and (not cache.startswith("/") or any(c in cache for c in ":,\n")):
            raise UserError(
                f"--deployment-json: compile_cache_dir {cache!r} is not an absolute path "
                "without ':' or ','; give one such as /var/cache/zenvllm/compile, or \"\" "
                "for none"
            )
        if settings.supervisor not in SUPERVISORS:
            raise UserError(
                f"--deployment-json: supervisor {settings.supervisor!r} is not one of "
                f"{', '.join(SUPERVISORS)}"
            )
        return settings.with_secrets(secrets or {})

    def with_secrets(self, secrets: dict[str, str]) -> Settings:
        """The env file's secrets never enter the plan, only their digest: a new key must
        still change the config hash and restart the instances."""
        given = {k: v for k, v in sorted(secrets.items()) if v}
        if not given:
            return self
        digest = hashlib.sha256(json.dumps(given).encode()).hexdigest()[:16]
        return Settings(**{**asdict(self), "secrets_digest": digest})


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
    def url(self) -> str:
        """Where a router or a scraper reaches it."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    @property
    def files(self) -> list[str]:
        """Every file a deployment writes for this instance (and refuses to take over)."""
        return [self.env_file, self.run_script, self.unit_file]

    def to_dict(self) -> dict:
        return {**asdict(self), "run_args": self.run_args, "files": self.files, "url": self.url}


def placement(instance) -> list[str]:
    """Where the plan put the instance: its cores, memory node, memory and shm."""
    return [
        f"--cpuset-cpus={format_cpu_list(instance.cpus)}",
        f"--cpuset-mems={format_cpu_list(instance.mems)}",
        f"--shm-size={instance.shm_size_mib}m",
        f"--memory={instance.memory_limit_mib}m",
    ]


def container_of(instance, settings: Settings) -> Container:
    """The container of one planned instance (a plan.Instance) under these settings."""
    name = instance.name
    env_file = f"{settings.config_dir}/{name}.env"
    served = (
        settings.served_model_name or settings.model_dir.rstrip("/").rsplit("/", 1)[-1] or "model"
    )
    env = {**instance.env, "HF_HUB_OFFLINE": "1", **settings.extra_env}
    command = [
        f"--model={settings.container_model_dir}",
        f"--served-model-name={served}",
        f"--host={settings.address}",
        f"--port={instance.port}",
        *([f"--max-model-len={settings.max_model_len}"] if settings.max_model_len else []),
        *settings.serve_args,
    ]
    cache = ""
    if settings.compile_cache_dir:
        key = compile_cache.key(
            f"{settings.image}@{settings.image_id}", placement(instance), command, env
        )
        cache = compile_cache.host_dir(settings.compile_cache_dir, name, key)
    options = [
        f"--name={name}",
        "--network=host",
        *placement(instance),
        f"--user={settings.user}",
        *SECURITY,
        *(
            [f"--security-opt=seccomp={settings.seccomp_profile}"]
            if settings.seccomp_profile
            else []
        ),
        f"--env-file={env_file}",
        f"--volume={settings.model_dir}:{settings.container_model_dir}:ro",
        *([f"--volume={cache}:{compile_cache.CONTAINER_DIR}"] if cache else []),
        "--label=zenvllm.managed=true",
        f"--label=zenvllm.deployment={settings.deployment}",
        f"--label=zenvllm.instance={name}",
        f"--label=zenvllm.port={instance.port}",
        f"--label=zenvllm.image-id={settings.image_id}",
        *settings.extra_options,
    ]
    # Everything that shapes the container, the env file (secrets by digest) included:
    # a container whose label differs is out of date and gets replaced.
    shape = [options, settings.image, command, sorted(env.items()), settings.secrets_digest]
    config_hash = hashlib.sha1(json.dumps(shape).encode()).hexdigest()
    return Container(
        name=name,
        address=settings.address,
        port=instance.port,
        image=settings.image,
        served_model_name=served,
        options=(*options, f"--label=zenvllm.config={config_hash}"),
        command=tuple(command),
        env=env,
        env_file=env_file,
        run_script=f"{settings.config_dir}/{name}.run.sh",
        unit=f"{name}.service",
        unit_file=f"{settings.unit_dir}/{name}.service",
        config_hash=config_hash,
        restart=SUPERVISORS[settings.supervisor],
        foreground=settings.supervisor == "systemd",
        cache_dir=cache,
    )
