"""`zenvllm ...` as an operator types it, and `python3 -m zenvllm.runtime ...` as the
roles run it on a host, each on this checkout's package by the test's own Python: the
one runner of the command lines in the tests, and what a refusal is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def zenvllm(
    *args: str,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    stdin: str | None = None,
    package: str = "zenvllm",
) -> subprocess.CompletedProcess:
    """The command's result (never raised on); `env` over this process's environment,
    the checkout's package first; `stdin` what it reads; `package` the entry point
    (zenvllm.runtime: the host's). A traceback is a bug whatever the exit code: an
    operator gets a message naming the value, the limit and the fix."""
    done = subprocess.run(
        [sys.executable, "-m", package, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(SCRIPTS), **(env or {})},
        timeout=timeout,  # a hang fails here
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def refused(done: subprocess.CompletedProcess, *says: str) -> str:
    """A refusal: exit 2, nothing on stdout, each of `says` on stderr; the stderr."""
    assert done.returncode == 2, (done.returncode, done.stdout[:300], done.stderr)
    assert done.stdout == "", done.stdout
    for text in says:
        assert text in done.stderr, (text, done.stderr)
    return done.stderr


def runtime(
    *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    """`python3 -m zenvllm.runtime ARGS`, as the roles run it on a host."""
    return zenvllm(*args, stdin=stdin, timeout=timeout, package="zenvllm.runtime")


def reported(done: subprocess.CompletedProcess) -> list[str]:
    """The paths a host step that writes says it wrote, or would ({"changed", "paths"}:
    files write, compile-cache prepare), after it succeeded."""
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["changed"] == bool(out["paths"])
    return out["paths"]
