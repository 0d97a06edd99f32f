"""Configuration (c): a real `ansible/deploy.yml` deployment on this host, measured at its
nginx gateway, then taken down again.

The deployment is the product's own: the planner's auto layout, the instances
role's containers and the gateway role's nginx site, with this run's model,
image and `vllm serve` arguments, under a deployment name of its own (deploy.yml
names, labels and prunes containers per deployment, so another deployment on
the same engine is left alone). Everything it writes goes under one work
directory, except the nginx site, which gets a name of its own too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from zenvllm.engine import DOCKER
from zenvllm.errors import UserError

ANSIBLE_DIR = Path(__file__).resolve().parents[2] / "ansible"
DEPLOYMENT_PREFIX = "zenvllm-bench-gw"


@dataclass(frozen=True)
class Deployment:
    work: Path
    model_dir: Path
    image: str
    port: int  # the gateway's
    base_port: int  # the instances'
    serve_args: tuple[str, ...]
    max_model_len: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        """deploy.yml's deployment name: one per gateway port, so runs on other ports coexist."""
        return f"{DEPLOYMENT_PREFIX}{self.port}"

    @property
    def site(self) -> Path:
        return Path(f"/etc/nginx/conf.d/zenvllm-bench-{self.port}.conf")

    def variables(self) -> dict:
        """deploy.yml's variables: a shared machine, so nothing host-wide is tuned."""
        etc = self.work / "etc"
        return {
            "zenvllm_model_dir": str(self.model_dir),
            "zenvllm_image": self.image,
            "zenvllm_docker_host": os.environ.get("DOCKER_HOST", ""),
            "zenvllm_host_manage_sysctls": False,
            "zenvllm_host_manage_shm": False,
            "zenvllm_host_engine_install": False,
            "zenvllm_instances_deployment": self.name,
            "zenvllm_instances_count": "auto",
            "zenvllm_instances_base_port": self.base_port,
            "zenvllm_instances_max_model_len": self.max_model_len,
            "zenvllm_instances_serve_args": list(self.serve_args),
            "zenvllm_instances_config_dir": str(etc),
            "zenvllm_instances_lib_dir": str(self.work / "lib"),
            "zenvllm_instances_seccomp_profile": str(etc / "seccomp-numa.json"),
            "zenvllm_instances_health_delay": 2,
            "zenvllm_gateway_listen": f"127.0.0.1:{self.port}",
            "zenvllm_gateway_site_path": str(self.site),
            "zenvllm_verify_health_delay": 2,
        }


def playbook_command() -> str:
    exe = Path(sys.executable).parent / "ansible-playbook"
    found = str(exe) if exe.exists() else shutil.which("ansible-playbook")
    if not found:
        raise UserError(
            "the gateway configuration runs ansible/deploy.yml and needs ansible-playbook; "
            "install the dev extra (pip install -e '.[dev]') or pass --gateway URL"
        )
    return found


def deploy(d: Deployment, log: Path, timeout_s: float = 1800) -> None:
    """Run deploy.yml; raise RuntimeError with its tail when it fails."""
    d.work.mkdir(parents=True, exist_ok=True)
    vars_file = d.work / "vars.json"
    fd = os.open(vars_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(d.variables(), out)
    cache = d.work / "ansible"
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
        "ANSIBLE_HOME": str(cache),
        "ANSIBLE_LOCAL_TEMP": str(cache / "tmp"),
        "ANSIBLE_REMOTE_TEMP": str(cache / "remote"),
        "ANSIBLE_NOCOLOR": "1",
    }
    argv = [playbook_command(), "deploy.yml", "-e", f"@{vars_file}"]
    with log.open("w") as out:
        try:
            done = subprocess.run(
                argv,
                cwd=ANSIBLE_DIR,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"deploy.yml ran over {timeout_s:.0f} s; see {log}") from None
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise RuntimeError(f"deploy.yml failed (exit {done.returncode}):\n{tail}")


def containers(d: Deployment) -> list[str]:
    label = f"label=zenvllm.deployment={d.name}"
    return DOCKER.words("ps", "--all", "--filter", label, "--format", "{{.Names}}")


def teardown(d: Deployment, logs: Path | None = None) -> None:
    """Remove the deployment's containers and nginx site; reload nginx; drop the work dir."""
    for name in containers(d):
        if logs is not None:
            done = DOCKER.run("logs", name)
            (logs / f"gateway-{name}.log").write_text(done.stdout + done.stderr)
        DOCKER.run("rm", "--force", name)
    d.site.unlink(missing_ok=True)
    if shutil.which("nginx") and Path("/run/nginx.pid").exists():
        subprocess.run(["nginx", "-s", "reload"], capture_output=True, check=False)
    shutil.rmtree(d.work, ignore_errors=True)
