"""Which container engine zenvllm uses on a host, decided once for `make` and the roles.

    python3 hostengine.py decide [--mode auto|distribution|external] [--docker-host URL]
                                 [--private-ok] [--json]
    python3 hostengine.py socket          # the DOCKER_HOST `make` uses by default
    python3 hostengine.py record PKG...   # remember packages zenvllm installed

The host is the operator's: zenvllm uses the engine it has (Docker's docker-ce, the
distribution's docker.io, Podman's Docker API, or a daemon from a tarball that
answers), installs Debian's docker.io only where no engine is installed, and never
starts, upgrades, removes or reconfigures an engine it did not install. Where what it
would need conflicts with what is installed, it refuses before anything changes.

A private dockerd (scripts/engine.sh, under /run/zenvllm) is only for machines where
systemd is not PID 1 (CI sandboxes, containers): nothing would start it after a reboot.

Standard library and the package's one engine edge (runtime/engine.py) only: `make`
and scripts/engine.sh run this file with the system's python3 before any venv exists,
and the host role runs it from the planner zipapp (`engine decide`).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass

if not __package__:  # run as a file (make, engine.sh): import the package it lives in
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from zenvllm.core.errors import UserError
from zenvllm.runtime.engine import DOCKER_NAME, Cli

MODES = ("auto", "distribution", "external")
# Debian's engine, installed only where a host has none.
DISTRIBUTION = ("docker.io", "containerd", "runc")
# Packages that are an engine; the first installed one names the host's engine.
ENGINES = ("docker-ce", "docker.io", "podman-docker")
# What Debian's engine cannot be installed beside, and who declares it (apt would
# remove the operator's package, and with it every container it runs).
CONFLICTS = {
    "docker-ce": "docker.io (it declares Conflicts: docker-ce)",
    "docker-ce-cli": "docker.io (it declares Conflicts: docker-ce-cli)",
    "docker-ce-rootless-extras": "docker.io (it declares Conflicts: docker-ce-rootless-extras)",
    "podman-docker": "docker.io (podman-docker declares Conflicts: docker.io)",
    "containerd.io": "containerd and runc (containerd.io declares Conflicts: containerd, runc)",
}
WATCHED = tuple(dict.fromkeys((*ENGINES, *DISTRIBUTION, *CONFLICTS)))
SERVICE = DOCKER_NAME  # the engine's systemd unit, docker.service
SYSTEM_SOCKET = "unix:///var/run/docker.sock"
PRIVATE_SOCKET = "unix:///run/zenvllm/docker.sock"
# Shared with the monitoring role: one file per package zenvllm installed.
RECORDS = "/var/lib/zenvllm/installed-packages"
RECORD_TEXT = "Installed by zenvllm; zenvllm may start and enable it.\n"


@dataclass(frozen=True)
class Facts:
    installed: tuple[str, ...]  # of WATCHED
    answers: bool  # `docker version` reached a daemon on docker_host
    systemd: bool  # systemd is PID 1
    ours: tuple[str, ...] = ()  # installed packages zenvllm's records say it installed
    docker_host: str = ""  # "" = the engine's default socket
    version: str = ""


@dataclass(frozen=True)
class Choice:
    action: str  # use | install | start | private | refuse
    engine: str  # what serves, in words
    packages: tuple[str, ...] = ()  # to install first
    message: str = ""
    unit: str = ""  # the systemd unit instance units depend on ("" = none)
    manage: bool = False  # zenvllm keeps the engine's service enabled and started


def where(facts: Facts) -> str:
    return facts.docker_host or f"the default socket ({SYSTEM_SOCKET})"


def decide(facts: Facts, mode: str = "auto", private_ok: bool = False) -> Choice:
    """The engine to use and what to do first; pure, so every branch is tested."""
    if mode not in MODES:
        return refuse(f"zenvllm_host_engine={mode!r} is not one of {', '.join(MODES)}.")
    installed = set(facts.installed)
    clash = conflicts(installed)
    engine = next((p for p in ENGINES if p in installed), "")
    unit = f"{SERVICE}.service" if facts.systemd and engine else ""
    named = f"{engine} ({facts.version})" if engine else f"the engine on {where(facts)}"
    # Its own: Debian's engine that zenvllm installed, or was told to manage.
    manage = (
        facts.systemd and engine == "docker.io" and (mode == "distribution" or engine in facts.ours)
    )
    if facts.answers and (mode != "distribution" or not clash):
        return Choice("use", named, unit=unit, manage=manage)
    if mode == "external":
        return refuse(
            f"zenvllm_host_engine=external, and no engine answers on {where(facts)}. Start "
            "the engine you manage, or point zenvllm_docker_host at the socket it listens on."
        )
    missing = tuple(p for p in DISTRIBUTION if p not in installed)
    if private_ok and not facts.systemd:  # a sandbox: `make` starts its own dockerd
        if engine or not clash:
            return Choice("private", "zenvllm's own dockerd", () if engine else missing)
        return refuse(clashing(clash[0], "No engine is installed, so `make engine` would install"))
    if mode == "auto" and engine:
        if engine == "docker.io" and engine in facts.ours and facts.systemd:
            return Choice("start", engine, unit=unit, manage=True)
        return refuse(
            f"{engine} is installed but no engine answers on {where(facts)}. zenvllm never "
            "starts, installs or reconfigures an engine it did not install: start yours "
            f"(systemctl enable --now {SERVICE}), or point zenvllm_docker_host at the socket "
            "it listens on. (zenvllm_host_engine=auto, the default, installs Debian's "
            "docker.io only on a host with no engine at all.)"
        )
    if clash:
        if mode == "distribution":
            return refuse(clashing(clash[0], "zenvllm_host_engine=distribution installs"))
        why = "No engine answers and none is installed, so zenvllm would install"
        return refuse(clashing(clash[0], why))
    if not facts.systemd:
        return refuse(
            f"No engine answers on {where(facts)}, and systemd is not PID 1 on this host, "
            "so no engine service would start after a reboot. Start an engine yourself "
            "(`make engine` starts zenvllm's own dockerd) and set zenvllm_docker_host to "
            "its socket."
        )
    return Choice(
        "install" if missing else "start", "docker.io", missing, unit="docker.service", manage=True
    )


def clashing(pkg: str, why: str) -> str:
    return (
        f"{why} Debian's {', '.join(DISTRIBUTION)}, but {pkg} is installed and conflicts "
        f"with {CONFLICTS[pkg]}: apt would remove {pkg}, and with it every container it "
        "runs. Nothing was changed. Keep your engine: install and start it whole, then set "
        "zenvllm_host_engine=external (and zenvllm_docker_host if it listens elsewhere "
        f"than {SYSTEM_SOCKET}); or remove {pkg} yourself first."
    )


def conflicts(installed: set[str]) -> list[str]:
    return [p for p in CONFLICTS if p in installed]


def refuse(message: str) -> Choice:
    return Choice("refuse", "", message=message)


# The edges: what the host has. Other programs' output is decoded with replacement and
# bounded in time; a record is read only from a regular file (a FIFO would block).


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """A command's exit status and standard output; (-1, "") when it is missing or hangs."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
            timeout=timeout,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired):
        return -1, ""
    return proc.returncode, proc.stdout


def dpkg_installed(packages: tuple[str, ...]) -> tuple[str, ...]:
    # dpkg-query exits 1 when some of the packages are unknown; the rest are still listed.
    fmt = "--showformat=${db:Status-Status} ${Package}\n"
    _, out = run(["dpkg-query", "--show", fmt, *packages], 60)
    return tuple(p for p in packages if f"installed {p}" in out.splitlines())


def engine_version(docker_host: str) -> str:
    """The daemon's version, or "" when none answers (or there is no docker client)."""
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    try:
        done = Cli(env=env).run("version", "--format", "{{.Server.Version}}", timeout=30)
    except (OSError, ValueError, subprocess.TimeoutExpired, UserError):  # ValueError: bytes
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def systemd_is_pid1() -> bool:
    return os.path.isdir("/run/systemd/system")  # what sd_booted() checks


def recorded(packages: tuple[str, ...], records: str = RECORDS) -> tuple[str, ...]:
    def ours(pkg: str) -> bool:
        path = os.path.join(records, pkg)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                return False
            with open(path, "rb") as f:
                return f.read(200).startswith(b"Installed by zenvllm")
        except OSError:
            return False

    return tuple(p for p in packages if ours(p))


def probe(docker_host: str) -> Facts:
    installed = dpkg_installed(WATCHED)
    version = engine_version(docker_host)
    return Facts(
        installed, bool(version), systemd_is_pid1(), recorded(installed), docker_host, version
    )


def record(packages: list[str], records: str = RECORDS) -> None:
    os.makedirs(records, mode=0o755, exist_ok=True)
    for pkg in packages:
        with open(os.path.join(records, pkg), "w", encoding="utf-8") as f:
            f.write(RECORD_TEXT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hostengine", description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    cmd = verbs.add_parser("decide", help="which engine to use, and what to do first")
    cmd.add_argument("--mode", default="auto")
    cmd.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST", ""))
    cmd.add_argument("--private-ok", action="store_true", help="may start a private dockerd")
    cmd.add_argument("--json", action="store_true", help="the whole choice, for the roles")
    verbs.add_parser("socket", help="the DOCKER_HOST `make` uses by default")
    rec = verbs.add_parser("record", help="remember packages zenvllm installed")
    rec.add_argument("packages", nargs="+")
    args = parser.parse_args(argv)
    if args.verb == "socket":
        print(SYSTEM_SOCKET if systemd_is_pid1() else PRIVATE_SOCKET)
        return 0
    if args.verb == "record":
        record(args.packages)
        return 0
    facts = probe(args.docker_host)
    choice = decide(facts, args.mode, args.private_ok)
    if args.json:
        print(json.dumps({**asdict(choice), "facts": asdict(facts)}))
        return 0
    if choice.action == "refuse":
        print(f"engine: {choice.message}", file=sys.stderr)
        return 2
    print(" ".join((choice.action, *choice.packages)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
