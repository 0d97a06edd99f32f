"""Deploy zenvllm on this machine with ansible/playbooks/deploy.yml, and take it all down again.

Everything the deployment writes goes to one temp dir (env files, run
scripts, the planner copy, the seccomp profile) except the nginx site, which
gets its own name so it never clobbers another deployment's. Extra vars go
to Ansible (support.ansible_run's runner) through a 0600 file (`-e @file`), never the
command line, so the fake secrets stay out of every process's arguments.

Systemd is not PID 1 here: the instances role then lets the engine's restart
policy (`--restart unless-stopped`) supervise the containers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from support import ansible_run, engine
from support.ansible_run import Run, planner_zipapp
from support.gateway import nginx_as_found

from zenvllm.bench.gateway import signal_nginx

REPO = Path(__file__).resolve().parents[2]
DOCKER_HOST = os.environ.get("DOCKER_HOST", "unix:///run/zenvllm/docker.sock")
IMAGE = "zenvllm/vllm-openai:0.32.0"
NGINX_DEFAULT_SITE = Path("/etc/nginx/sites-enabled/default")
# Fake secrets: the least-privilege tests look for them everywhere they must not be.
HF_TOKEN = "hf_zenvllmFAKEtoken0123456789reliability"
API_KEY = "sk-zenvllm-FAKE-key-0123456789-reliability"
SECRETS = REPO / ".cache" / "secrets"


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """support.engine's, on this fleet's engine and without a time limit."""
    env = {**os.environ, "DOCKER_HOST": DOCKER_HOST}
    return engine.docker(*args, check=check, timeout=None, env=env)


@dataclass
class Fleet:
    root: Path
    model_dir: Path
    base_port: int = 8311
    gateway_port: int = 8310
    image: str = IMAGE
    deployment: str = "zenvllm-rel"  # names its containers and env files <deployment>-<n>
    extra: dict = field(default_factory=dict)

    @property
    def config_dir(self) -> Path:
        return self.root / "etc"

    @property
    def site(self) -> Path:
        return Path(f"/etc/nginx/conf.d/zenvllm-reliability-{self.gateway_port}.conf")

    @property
    def gateway(self) -> str:
        return f"https://127.0.0.1:{self.gateway_port}"

    @property
    def ca(self) -> str:
        """The certificate clients trust (the deployment's CA), as the controller keeps it."""
        return str(SECRETS / self.deployment / "localhost-ca.pem")

    def ports(self, n: int = 2) -> list[int]:
        return [self.base_port + i for i in range(n)]

    def names(self, n: int = 2) -> list[str]:
        return [f"{self.deployment}-{i}" for i in range(n)]

    def variables(self, **override) -> dict:
        return {
            "zenvllm_model_dir": str(self.model_dir),
            "zenvllm_image": self.image,
            "zenvllm_docker_host": DOCKER_HOST,
            "zenvllm_hf_token": HF_TOKEN,
            "zenvllm_api_key": API_KEY,
            # This is a shared CI machine: no sysctls, no /etc/fstab edits.
            "zenvllm_host_manage_sysctls": False,
            "zenvllm_host_manage_shm": False,
            "zenvllm_host_engine": "external",  # the private engine scripts/engine.sh started
            "zenvllm_instances_count": 2,
            "zenvllm_instances_deployment": self.deployment,
            "zenvllm_instances_base_port": self.base_port,
            # Two instances of a 2 MB model on a shared 24 GiB machine: 1 GiB KV each.
            "zenvllm_instances_kv_cache_gib": 1,
            "zenvllm_instances_max_model_len": 512,
            "zenvllm_instances_served_model_name": "tiny",
            "zenvllm_instances_serve_args": ["--enforce-eager"],
            "zenvllm_instances_supervisor": "engine",
            "zenvllm_instances_config_dir": str(self.config_dir),
            "zenvllm_instances_lib_dir": str(self.root / "lib"),
            "zenvllm_instances_revisions_dir": str(self.root / "revisions" / self.deployment),
            "zenvllm_instances_seccomp_profile": str(self.config_dir / "seccomp-numa.json"),
            # A snapshot: an edit in the checkout must not change a rollout's plan.
            "zenvllm_planner": str(self.root / "zenvllm.pyz"),
            "zenvllm_instances_health_timeout": 600,
            "zenvllm_instances_health_delay": 2,
            "zenvllm_gateway_listen": f"127.0.0.1:{self.gateway_port}",
            "zenvllm_gateway_site_path": str(self.site),
            "zenvllm_gateway_tls_dir": str(self.root / "tls"),
            # The load here is the test's own: limits would only count as failures.
            "zenvllm_gateway_requests_per_second": 1000,
            "zenvllm_gateway_burst": 1000,
            "zenvllm_verify_health_delay": 2,
            **self.extra,
            **override,
        }

    def playbook(self, *args: str, timeout: float = 1200, **override) -> Run:
        """deploy.yml with these variables, given in a 0600 file (`-e @file`) before the
        caller's arguments, so a test's own `-e` wins."""
        self.root.mkdir(parents=True, exist_ok=True)
        planner_zipapp(self.root)
        vars_file = self.root / "vars.json"
        fd = os.open(vars_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(self.variables(**override), out)
        remote_temp = str(self.root / "ansible-remote-tmp")
        environ = {"ANSIBLE_REMOTE_TEMP": remote_temp, "DOCKER_HOST": DOCKER_HOST}
        return ansible_run.playbook("-e", f"@{vars_file}", *args, timeout=timeout, environ=environ)

    def containers(self, n: int = 2) -> list[str]:
        """This fleet's containers (by port label: another deployment's are not ours)."""
        names: set[str] = set()
        for port in self.ports(n):
            done = docker(
                "ps", "--all", "--filter", f"label=zenvllm.port={port}", "--format", "{{.Names}}"
            )
            names.update(done.stdout.split())
        return sorted(names)

    def teardown(self, default_site_was_there: bool) -> None:
        for name in self.containers():
            docker("rm", "--force", name, check=False)
        self.site.unlink(missing_ok=True)
        self.site.with_suffix(".js").unlink(missing_ok=True)  # several models' router
        if default_site_was_there and not NGINX_DEFAULT_SITE.exists():
            NGINX_DEFAULT_SITE.symlink_to("/etc/nginx/sites-available/default")
        signal_nginx(signal.SIGHUP)
        # The containers' /dev/shm and /tmp (libiomp5 and vLLM leftovers) go with them.
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def deploy_then_remove(fleet: Fleet, log: Path) -> Iterator[Run]:
    """deploy.yml's run for the fleet, its output kept in `log` (the whole story when it
    fails), asserted to pass; then always taken down, nginx's default site put back and
    nginx stopped again if this run started it."""
    default_site = NGINX_DEFAULT_SITE.exists()
    with nginx_as_found():
        start = time.monotonic()
        done = fleet.playbook("-v")
        print(f"\ndeploy.yml ({fleet.deployment}): rc {done.rc} in "
              f"{time.monotonic() - start:.0f} s")  # fmt: skip
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(done.output)
        try:
            assert done.rc == 0, f"see {log}: " + done.output[-4000:]
            yield done
        finally:
            fleet.teardown(default_site)
