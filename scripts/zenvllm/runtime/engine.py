"""The one place zenvllm names, chooses and runs a container engine (docker or podman).

The engines' names (DOCKER_NAME, PODMAN_NAME: an engine's kind is its command's name)
and the binary's one setting (ZENVLLM_DOCKER) are spelled here alone, and
`choose_engine` picks the engine a build runs (docker, with BuildKit where its client
has it, or podman). Every engine command in the package, on the controller and on a
host (the runtime layer ships in the zipapp), goes through a `Cli`; its binary is
`docker` unless ZENVLLM_DOCKER names another (the roles set it from zenvllm_docker_bin:
for the host's engine probe, `zenvllm status` and its timer's unit).
`run` captures the output; `started` and `call` send it to a file or a pipe (builds)
and kill the command if the caller is interrupted; `stream` starts one the caller
watches itself (benchmark clients, with their own deadline). One place finds the binary,
says how to get one when it is missing, and turns a failure the caller cannot go on from
into an error that names the command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO

from zenvllm.core import gate
from zenvllm.core.errors import UserError

# The engines, by kind; an engine's kind is also its command's name.
DOCKER_NAME = "docker"
PODMAN_NAME = "podman"
# The one setting that names the engine's binary (the roles set it from zenvllm_docker_bin).
BINARY_SETTING = "ZENVLLM_DOCKER"
# `podman build --format`: Docker's image format (podman's default OCI one has no HEALTHCHECK).
DOCKER_FORMAT = "docker"
ENGINES = ("auto", DOCKER_NAME, PODMAN_NAME)
BUILDERS = ("auto", "buildkit", "legacy")


@dataclass(frozen=True)
class Cli:
    binary: str = field(default_factory=lambda: os.environ.get(BINARY_SETTING, DOCKER_NAME))
    env: Mapping[str, str] | None = None  # e.g. DOCKER_BUILDKIT=1 for a pre-23 client

    def _missing(self) -> UserError:
        return UserError(
            f"{self.binary} not found; run `make engine` (Debian's docker.io) or install "
            "docker or podman"
        )

    def run(
        self,
        *args: str,
        timeout: float | None = 120,
        check: bool = False,
        stdin: IO[bytes] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """The command's result, output captured as text; with `check`, a failure raises
        RuntimeError naming the command and the engine's own words."""
        try:
            done = subprocess.run(
                [self.binary, *args],
                capture_output=stdin is None,
                stdin=stdin,
                text=stdin is None,
                timeout=timeout,
                env=dict(self.env) if self.env is not None else None,
                check=False,
            )
        except FileNotFoundError:
            raise self._missing() from None
        if check and done.returncode != 0:
            err = done.stderr if isinstance(done.stderr, str) else ""
            raise RuntimeError(f"{self.binary} {' '.join(args[:3])}...: {err.strip()[-2000:]}")
        return done

    def ok(self, *args: str, timeout: float | None = 120) -> bool:
        return self.run(*args, timeout=timeout).returncode == 0

    def words(self, *args: str) -> list[str]:
        """stdout split on whitespace (names, IDs)."""
        return self.run(*args).stdout.split()

    @contextmanager
    def started(
        self, *args: str, out: IO[str] | IO[bytes] | int
    ) -> Iterator[subprocess.Popen[bytes]]:
        """The running command, its output to `out` (a file or subprocess.PIPE). Whatever
        interrupts the caller (an error, Ctrl-C, SIGTERM as KeyboardInterrupt) kills the
        command rather than waiting for it: an interrupted build must not go on to tag."""
        with self.stream(*args, out=out) as proc:
            try:
                yield proc
            except BaseException:
                proc.kill()
                raise

    def call(self, *args: str, out: IO[str] | IO[bytes]) -> int:
        """Run the command with its output to `out`; its exit status."""
        with self.started(*args, out=out) as proc:
            return proc.wait()

    def stream(self, *args: str, out: IO[str] | IO[bytes] | int) -> subprocess.Popen[bytes]:
        """Start the command with stdout and stderr going to `out`; the caller waits."""
        try:
            return subprocess.Popen(
                [self.binary, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(self.env) if self.env is not None else None,
            )
        except FileNotFoundError:
            raise self._missing() from None

    def converse(self, *args: str, err: IO[str] | IO[bytes]) -> subprocess.Popen[bytes]:
        """Start the command with pipes to its stdin and from its stdout (stderr to
        `err`): a long-lived process the caller talks to a line at a time."""
        try:
            return subprocess.Popen(
                [self.binary, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=dict(self.env) if self.env is not None else None,
            )
        except FileNotFoundError:
            raise self._missing() from None


DOCKER = Cli()


@dataclass(frozen=True)
class Engine:
    """The engine a build runs: its kind, its binary and its builder."""

    kind: str  # DOCKER_NAME or PODMAN_NAME
    binary: str
    buildkit: bool  # BuildKit (cache mounts) rather than docker's legacy builder

    @property
    def builder(self) -> str:
        if self.kind == PODMAN_NAME:
            return "Buildah"  # podman's builder; it takes cache mounts too
        return "BuildKit" if self.buildkit else "legacy builder"


def client_major(binary: str) -> int | None:
    done = Cli(binary).run("version", "--format", "{{.Client.Version}}", timeout=None)
    head = done.stdout.strip().split(".")[0]
    return int(head) if head.isdigit() else None


def has_buildkit(binary: str) -> bool:
    """Clients before 23 carry BuildKit inside (DOCKER_BUILDKIT=1); later ones need buildx."""
    if Cli(binary).run("buildx", "version", timeout=None).returncode == 0:
        return True
    major = client_major(binary)
    return major is not None and major < 23


def docker_candidates() -> list[str]:
    # Debian's /usr/bin/docker (20.10) has BuildKit built in; a newer client on
    # PATH without the buildx plugin only has the legacy builder.
    found = [shutil.which(DOCKER_NAME), "/usr/bin/docker"]
    return list(dict.fromkeys(p for p in found if p and os.access(p, os.X_OK)))


def choose_engine(kind: str = "auto", builder: str = "auto") -> Engine:
    if kind not in ENGINES:
        raise UserError(f"--engine {kind!r} is not one of {', '.join(ENGINES)}")
    if builder not in BUILDERS:
        raise UserError(f"--builder {builder!r} is not one of {', '.join(BUILDERS)}")
    if kind in ("auto", DOCKER_NAME):
        candidates = docker_candidates()
        if candidates:
            if builder == "legacy":
                return Engine(DOCKER_NAME, candidates[0], False)
            for binary in candidates:
                if has_buildkit(binary):
                    return Engine(DOCKER_NAME, binary, True)
            if builder == "buildkit":
                raise UserError(
                    "--builder buildkit: no docker client here has BuildKit "
                    "(install docker-buildx or Debian's docker.io client)"
                )
            return Engine(DOCKER_NAME, candidates[0], False)
        if kind == DOCKER_NAME:
            raise UserError("docker not found: run `make engine` or pass --engine podman")
    podman = shutil.which(PODMAN_NAME)
    if podman is None:
        raise UserError("no container engine found: run `make engine` (docker) or install podman")
    return Engine(PODMAN_NAME, podman, builder != "legacy")


def cgroup_driver(cli: Cli = DOCKER) -> str:
    """How the engine names cgroups ("systemd" or "cgroupfs"; Podman calls it its cgroup
    manager), or "" where no engine answers."""
    try:
        done = cli.run("info", "--format", "{{json .}}", timeout=30)
    except UserError:  # no engine binary here
        return ""
    try:
        info = (
            gate.parse_json(done.stdout, f"{cli.binary} info", "") if done.returncode == 0 else {}
        )
    except gate.InputError:
        return ""
    if not isinstance(info, dict):
        return ""
    host = info.get("host") or info.get("Host") or {}
    named = info.get("CgroupDriver") or (host.get("cgroupManager") or host.get("CgroupManager"))
    return named if named in ("systemd", "cgroupfs") else ""
