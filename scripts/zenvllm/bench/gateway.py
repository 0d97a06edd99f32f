"""Configuration (c): a real `ansible/playbooks/deploy.yml` deployment on this host, measured at its
nginx gateway, then taken down again.

The deployment is the product's own: the planner's auto layout, the instances
role's containers and the gateway role's nginx site, with this run's model,
image and `vllm serve` arguments, under a deployment name of its own (deploy.yml
names, labels and prunes containers per deployment, so another deployment on
the same engine is left alone). Everything it writes goes under one work
directory, except the nginx site, which gets a name of its own too. Neither may
be anyone else's: both are checked before the run and removed only when zenvllm
wrote them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.deploy import data, outputs, playbooks, shipped
from zenvllm.runtime.engine import DOCKER

ANSIBLE_DIR = data.ANSIBLE
DEPLOYMENT_PREFIX = "zenvllm-bench-gw"
PORTS = (90, 99)  # above --base-port: nginx, and its instances up to the last
# The gateway role's site starts with this header (templates/zenvllm.conf.j2).
SITE_HEADER = "# zenvllm gateway: "
NGINX_PID = Path("/run/nginx.pid")  # Debian's and Ubuntu's nginx.conf: `pid /run/nginx.pid;`
# Left in the work directory when this run's deploy started nginx: teardown stops it.
STARTED_NGINX = "nginx-started-here"
NO_ANSIBLE = (
    "the gateway configuration runs zenvllm's deploy playbook and needs ansible-playbook; "
    f"{playbooks.INSTALL} or pass --gateway URL"
)


@dataclass(frozen=True)
class Deployment:
    work: Path
    model_dir: Path
    image: str
    port: int  # the gateway's
    base_port: int  # the instances'
    serve_args: tuple[str, ...]
    max_model_len: int
    site_dir: Path = Path("/etc/nginx/conf.d")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        """deploy.yml's deployment name: one per gateway port, so runs on other ports coexist."""
        return f"{DEPLOYMENT_PREFIX}{self.port}"

    @property
    def site(self) -> Path:
        return self.site_dir / f"zenvllm-bench-{self.port}.conf"

    def variables(self) -> dict[str, Any]:
        """deploy.yml's variables: a shared machine, so nothing host-wide is tuned."""
        etc = self.work / "etc"
        return {
            "zenvllm_model_dir": str(self.model_dir),
            "zenvllm_image": self.image,
            "zenvllm_docker_host": os.environ.get("DOCKER_HOST", ""),
            "zenvllm_host_manage_sysctls": False,
            "zenvllm_host_manage_shm": False,
            "zenvllm_host_engine": "external",  # the private engine scripts/engine.sh started
            "zenvllm_instances_deployment": self.name,
            "zenvllm_instances_count": "auto",
            "zenvllm_instances_base_port": self.base_port,
            "zenvllm_instances_max_model_len": self.max_model_len,
            "zenvllm_instances_serve_args": list(self.serve_args),
            "zenvllm_instances_config_dir": str(etc),
            "zenvllm_instances_lib_dir": str(self.work / "lib"),
            # Its revisions too: a throwaway deployment leaves nothing in /var/lib/zenvllm.
            "zenvllm_instances_revisions_dir": str(self.work / "revisions" / self.name),
            # The planner as hosts receive it, made from this installed package.
            "zenvllm_planner": str(self.work / "zenvllm.pyz"),
            "zenvllm_instances_seccomp_profile": str(etc / "seccomp-numa.json"),
            "zenvllm_instances_health_delay": 2,
            "zenvllm_gateway_listen": f"127.0.0.1:{self.port}",
            "zenvllm_gateway_site_path": str(self.site),
            # On loopback for the run's own clients: the sweep compares serving layouts,
            # so this gateway opts out of the key and TLS a deployment has by default.
            "zenvllm_gateway_anonymous": True,
            "zenvllm_gateway_tls": False,
            "zenvllm_verify_health_delay": 2,
        }


def site_is_ours(site: Path) -> bool:
    if site.is_symlink():
        return False
    try:
        text = gate.read_text(site, gate.SMALL, "", optional=True) or ""
    except gate.InputError:  # a FIFO, a huge or a binary file: not a site zenvllm wrote
        return False
    return any(line.startswith(SITE_HEADER) for line in text.splitlines()[:5])


def check_paths(d: Deployment) -> None:
    """Refuse, before any work, a work directory or nginx site that is not zenvllm's."""
    outputs.check_output(d.work, "the gateway's work directory")
    if (d.site.exists() or d.site.is_symlink()) and not site_is_ours(d.site):
        raise UserError(
            f"{d.site} exists and zenvllm did not write it (no {SITE_HEADER!r} header); "
            "move it away, or give --base-port another value (the site is named after "
            "the gateway's port)"
        )


def deploy(d: Deployment, log: Path, timeout_s: float = 1800) -> None:
    """Run deploy.yml; raise RuntimeError with its tail when it fails."""
    check_paths(d)
    outputs.claim(d.work, "the gateway's work directory")
    nginx_ran = nginx_master() is not None
    shipped.write_zipapp(d.work / "zenvllm.pyz")
    vars_file = d.work / "vars.json"
    fd = os.open(vars_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(d.variables(), out)
    cache = d.work / "ansible"
    env = playbooks.environment(cache, ANSIBLE_DIR, ANSIBLE_REMOTE_TEMP=str(cache / "remote"))
    argv = playbooks.command("playbooks/deploy.yml", "-e", f"@{vars_file}", missing=NO_ANSIBLE)
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
        finally:
            if not nginx_ran and nginx_master() is not None:
                (d.work / STARTED_NGINX).write_text("")
            outputs.seal(d.work)  # what the play wrote there is zenvllm's too
    if done.returncode != 0:
        tail = "\n".join(gate.tail(log).splitlines()[-25:])
        raise RuntimeError(f"deploy.yml failed (exit {done.returncode}):\n{tail}")


def containers(d: Deployment) -> list[str]:
    label = f"label=zenvllm.deployment={d.name}"
    return DOCKER.words("ps", "--all", "--filter", label, "--format", "{{.Names}}")


def teardown(d: Deployment, logs: Path | None = None) -> None:
    """Remove the deployment's containers, its nginx site and work dir; reload nginx
    without the site, or stop it if this run's deploy started it."""
    for name in containers(d):
        if logs is not None:
            done = DOCKER.run("logs", name)
            (logs / f"gateway-{name}.log").write_text(done.stdout + done.stderr)
        DOCKER.run("rm", "--force", name)
    started_here = (d.work / STARTED_NGINX).exists()
    remove_own_files(d)
    if started_here:
        stop_nginx()
    else:
        signal_nginx(signal.SIGHUP)


def nginx_master() -> int | None:
    """The running nginx master's pid, else None. A pid file is no proof: one left by a
    killed nginx names another process once the pid is reused (seen here: a thread of
    dockerd), and `nginx -s reload` would signal that process."""
    try:
        pid = int(gate.read_text(NGINX_PID, gate.SMALL, "", optional=True) or "")
        exe = os.readlink(f"/proc/{pid}/exe")
    except (gate.InputError, OSError, ValueError):
        return None
    return pid if Path(exe.removesuffix(" (deleted)")).name == "nginx" else None  # upgraded


def stop_nginx(timeout_s: float = 30) -> None:
    """Stop nginx and wait until it has: gracefully (QUIT lets open requests finish),
    then at once (TERM). Whoever looks next must not find it still quitting."""
    for sig in (signal.SIGQUIT, signal.SIGTERM):
        if not signal_nginx(sig):
            return
        deadline = time.monotonic() + timeout_s
        while nginx_master() is not None and time.monotonic() < deadline:
            time.sleep(0.5)


def signal_nginx(sig: signal.Signals) -> bool:
    """Send `sig` to the running nginx master (HUP reloads, QUIT stops gracefully);
    False if none runs."""
    pid = nginx_master()
    if pid is None:
        return False
    os.kill(pid, sig)
    return True


def remove_own_files(d: Deployment) -> None:
    """The site and the work directory, each only if zenvllm wrote it."""
    if site_is_ours(d.site):
        d.site.unlink()
    outputs.remove_owned(d.work)


def deployment_for(
    out: Path, base_port: int, model_dir: Path, image: str, eager: bool, max_len: int
) -> Deployment:
    """`zenvllm bench --gateway deploy`'s deployment: it serves like the servers it is
    compared with (same image, eager mode, context), on ports above theirs; its paths
    are checked before any work."""
    serve = ["--enforce-eager"] if eager else []  # the plan sets --dtype
    if base_port + PORTS[1] > 65535:
        raise UserError(
            f"--base-port {base_port}: the gateway's deployment takes ports "
            f"{base_port + PORTS[0]}-{base_port + PORTS[1]}, past "
            f"65535; give --base-port {65535 - PORTS[1]} or lower"
        )
    deployment = Deployment(
        work=out.resolve().parent / f".{out.name}.gateway",
        model_dir=model_dir,
        image=image,
        port=base_port + PORTS[0],
        base_port=base_port + PORTS[0] + 1,
        serve_args=tuple(serve),
        max_model_len=max_len,
    )
    check_paths(deployment)  # before any work
    return deployment
