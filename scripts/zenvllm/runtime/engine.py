"""The one way zenvllm runs a container engine's command line (docker or podman).

Every engine command in the package, on the controller and on a host (the runtime
layer ships in the zipapp), goes through a `Cli`; its binary is `docker` unless
ZENVLLM_DOCKER names another (the roles set it from zenvllm_docker_bin: for the host's
engine probe, `zenvllm status` and its timer's unit).
`run` captures the output; `started` and `call` send it to a file or a pipe (builds)
and kill the command if the caller is interrupted; `stream` starts one the caller
watches itself (benchmark clients, with their own deadline). One place finds the binary,
says how to get one when it is missing, and turns a failure the caller cannot go on from
into an error that names the command.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO

from zenvllm.core import gate
from zenvllm.core.errors import UserError


@dataclass(frozen=True)
class Cli:
    binary: str = field(default_factory=lambda: os.environ.get("ZENVLLM_DOCKER", "docker"))
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
