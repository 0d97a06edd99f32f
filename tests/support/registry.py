"""A real, private container registry for tests: Debian's docker-registry (distribution 2.8)
with TLS and htpasswd basic auth, run as a plain process with its own config.

    with registry.running(tmp_path, hosts=(registry.host_address(), "127.0.0.1")) as reg:
        reg.login(config_dir)                  # docker login into a temporary DOCKER_CONFIG
        ... docker push f"{reg.address}/zenvllm/vllm-openai:0.32.0" ...

reg.address is the first host's. Address it by a non-loopback IP to test TLS: dockerd
counts 127.0.0.0/8 as an insecure registry by default, so on loopback it verifies no
certificate and falls back to plain HTTP (an anonymous pull then fails with
"connection reset by peer" rather than the registry's refusal).

Everything lives in the given directory: a CA and a server certificate made with
openssl (SAN = the hosts given, so hosts on a bridge can pull too), a bcrypt
htpasswd, the config and the storage (removed on the way out: pushed images are GBs).
The engine trusts the CA through /etc/docker/certs.d/HOST:PORT/ca.crt (and podman's
/etc/containers/certs.d), one directory per host and this port, removed exactly on
the way out. Logins go to a DOCKER_CONFIG the caller gives, never ~/.docker.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from support.engine import engine_env

PACKAGES = ("docker-registry", "apache2-utils")  # the registry; htpasswd
CERTS_DIRS = (Path("/etc/docker/certs.d"), Path("/etc/containers/certs.d"))
SERVICE = "docker-registry"
APT_INSTALL = Path(__file__).resolve().parents[2] / "scripts" / "apt_install.sh"


class Reply(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Registry:
    hosts: tuple[str, ...]
    port: int
    user: str
    password: str
    ca: Path
    log: Path

    @property
    def address(self) -> str:
        """HOST:PORT of the first host, as image references and `docker login` name it."""
        return self.at(self.hosts[0])

    def at(self, host: str) -> str:
        return f"{host}:{self.port}"

    def request(
        self, path: str, auth: bool = True, method: str = "GET", accept: str | None = None
    ) -> Reply:
        """https://ADDRESS/PATH of the registry's API, trusting only its CA."""
        req = urllib.request.Request(f"https://{self.address}{path}", method=method)
        if accept:
            req.add_header("Accept", accept)
        if auth:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        context = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(req, context=context, timeout=30) as reply:
                return Reply(reply.status, dict(reply.headers), reply.read())
        except urllib.error.HTTPError as err:
            return Reply(err.code, dict(err.headers), err.read())

    def json(self, path: str, accept: str | None = None) -> dict:
        reply = self.request(path, accept=accept)
        assert reply.status == 200, reply
        return json.loads(reply.body)

    def catalog(self) -> list[str]:
        return self.json("/v2/_catalog")["repositories"]

    def login(self, config: Path, binary: str = "docker") -> None:
        """`docker login` into the DOCKER_CONFIG directory `config` (the password on stdin)."""
        config.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [binary, "login", self.address, "--username", self.user, "--password-stdin"],
            input=self.password,
            env=client_env(config),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"docker login {self.address}: {done.stderr}"


def host_address() -> str | None:
    """This machine's first global IPv4 address (not loopback), if it has one."""
    done = subprocess.run(
        ["ip", "-j", "-4", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=False,
    )
    found = [a["local"] for link in json.loads(done.stdout or "[]") for a in link["addr_info"]]
    return found[0] if found else None


def client_env(config: Path) -> dict[str, str]:
    """The engine's environment with logins kept in `config`, not the user's ~/.docker."""
    return {**engine_env(), "DOCKER_CONFIG": str(config)}


def ensure_installed() -> None:
    """Debian's docker-registry and htpasswd; the service the package enables is stopped
    and disabled at once (the tests run their own, on their own port)."""
    if shutil.which("docker-registry") and shutil.which("htpasswd"):
        return
    subprocess.run([str(APT_INSTALL), *PACKAGES], check=True)
    for quiet in (["systemctl", "disable", "--now", SERVICE], ["service", SERVICE, "stop"]):
        with contextlib.suppress(OSError):
            subprocess.run(quiet, capture_output=True, check=False, timeout=60)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _san(host: str) -> str:
    try:
        ipaddress.ip_address(host)
        return f"IP:{host}"
    except ValueError:
        return f"DNS:{host}"


def make_tls(root: Path, hosts: Sequence[str]) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for `hosts`: (ca.crt, server.crt, server.key)."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        *("req", "-x509", "-new", *ec, "-days", "2", "-subj", "/CN=zenvllm test registry CA"),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
        *("-keyout", "ca.key", "-out", "ca.crt"),
        cwd=root,
    )
    _openssl(
        *("req", "-new", *ec, "-subj", f"/CN={hosts[0]}"),
        *("-keyout", "server.key", "-out", "server.csr"),
        cwd=root,
    )
    (root / "server.ext").write_text(
        f"subjectAltName={','.join(_san(h) for h in hosts)}\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        *("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
        *("-set_serial", f"0x{secrets.token_hex(8)}", "-days", "2", "-extfile", "server.ext"),
        *("-out", "server.crt"),
        cwd=root,
    )
    return root / "ca.crt", root / "server.crt", root / "server.key"


def config_yaml(listen: str, storage: Path, crt: Path, key: Path, htpasswd: Path) -> str:
    # JSON is YAML: no YAML writer needed, and every path is quoted.
    return json.dumps(
        {
            "version": 0.1,
            "log": {"level": "info", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
            "http": {
                "addr": listen,
                "tls": {"certificate": str(crt), "key": str(key)},
                "headers": {"X-Content-Type-Options": ["nosniff"]},
            },
            "auth": {"htpasswd": {"realm": "zenvllm-test-registry", "path": str(htpasswd)}},
        },
        indent=2,
    )


def free_port(bind: str) -> int:
    with socket.socket() as s:
        s.bind((bind, 0))
        return s.getsockname()[1]


def _trust(ca: Path, hosts: Sequence[str], port: int, made: list[Path]) -> None:
    """Put the CA where the engines look; `made` gets each directory made, innermost
    first (HOST:PORT ones, then a certs.d made here), as it goes."""
    for certs in CERTS_DIRS:
        if not certs.exists():
            made.append(certs)
        for host in hosts:
            where = certs / f"{host}:{port}"  # unique per port: parallel registries coexist
            where.mkdir(parents=True, exist_ok=True)
            made.insert(0, where)
            shutil.copyfile(ca, where / "ca.crt")


def _wait_ready(reg: Registry, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"docker-registry exited {proc.returncode}:\n{reg.log.read_text()}"
            )
        with contextlib.suppress(OSError):
            if reg.request("/v2/", auth=False).status == 401:  # up, and asking for credentials
                return
        time.sleep(0.2)
    raise AssertionError(f"docker-registry not ready in {timeout:.0f} s:\n{reg.log.read_text()}")


@contextlib.contextmanager
def running(
    workdir: Path, hosts: Sequence[str] = ("127.0.0.1",), trust: bool = True
) -> Iterator[Registry]:
    """A registry on a free port, with TLS for `hosts` and basic auth; with `trust`, the
    engines trust its CA for the duration. Stopped, its storage and trust removed, after."""
    ensure_installed()
    root = Path(workdir) / "registry"
    root.mkdir(parents=True)
    ca, crt, key = make_tls(root, hosts)
    user, password = "zenvllm", secrets.token_urlsafe(18)
    htpasswd = root / "htpasswd"
    subprocess.run(
        ["htpasswd", "-B", "-i", "-c", str(htpasswd), user],
        input=password,
        text=True,
        check=True,
        capture_output=True,
    )
    # On the one address its clients reach (loopback, or a bridge's), else on all.
    bind = hosts[0] if len(hosts) == 1 else "0.0.0.0"
    port = free_port(bind)
    storage = root / "storage"
    config = root / "config.yml"
    config.write_text(config_yaml(f"{bind}:{port}", storage, crt, key, htpasswd))
    reg = Registry(tuple(hosts), port, user, password, ca, root / "registry.log")
    # REGISTRY_* variables override the config file (podman's REGISTRY_AUTH_FILE would).
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    trusted: list[Path] = []
    with reg.log.open("w") as log:
        proc = subprocess.Popen(
            ["docker-registry", "serve", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        _wait_ready(reg, proc)
        if trust:
            _trust(ca, hosts, port, trusted)
        yield reg
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for where in trusted:
            if where.parent in CERTS_DIRS:
                shutil.rmtree(where, ignore_errors=True)
            else:  # a certs.d made here: only if empty (another registry may use it)
                with contextlib.suppress(OSError):
                    where.rmdir()
        shutil.rmtree(storage, ignore_errors=True)
