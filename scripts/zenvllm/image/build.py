"""Drive the container engine's builds: docker (BuildKit when the client has it) or podman.

Thin on purpose: the command line is a pure function of the engine runtime/engine.py
chose (`choose_engine`); running it is the only side effect.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.runtime.engine import DOCKER_FORMAT, DOCKER_NAME, PODMAN_NAME, Cli, Engine

# podman's default rlimits fail here ("error setting rlimit type 7"), for builds and runs.
PODMAN_ULIMITS = ("--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096")


def _run(argv: list[str], env: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    return Cli(argv[0], env).run(*argv[1:], timeout=None)


def check_daemon(engine: Engine) -> None:
    if engine.kind == DOCKER_NAME:
        done = _run([engine.binary, "version", "--format", "{{.Server.Version}}"])
        if done.returncode != 0:
            host = os.environ.get("DOCKER_HOST", "the default socket")
            raise UserError(
                f"no docker daemon answers on {host}: run `make engine` or set DOCKER_HOST"
            )


def build_argv(
    engine: Engine,
    context: Path,
    tag: str,
    network: str,
    base_image: str | None,
    iidfile: Path,
    no_cache: bool = False,
) -> list[str]:
    argv = [engine.binary, "build", "--network", network, "--tag", tag]
    argv += ["--iidfile", str(iidfile)]
    if engine.kind == DOCKER_NAME and engine.buildkit:
        argv += ["--progress", "plain"]
    if engine.kind == PODMAN_NAME:
        argv += PODMAN_ULIMITS
        # Its default OCI image format has no HEALTHCHECK and would drop ours.
        argv += ["--format", DOCKER_FORMAT]
    if base_image:
        argv += ["--build-arg", f"BASE_IMAGE={base_image}"]
    if no_cache:
        argv.append("--no-cache")
    return [*argv, str(context)]


def build_env(engine: Engine) -> dict[str, str]:
    env = dict(os.environ)
    if engine.kind == DOCKER_NAME:
        env["DOCKER_BUILDKIT"] = "1" if engine.buildkit else "0"
    return env


# BuildKit's plain progress: "#11 [build 1/5] RUN ..." heads a step, "#11 ERROR: ..."
# marks it failed. The legacy builder: "Step 7/25 : RUN ..." then "The command ...
# returned a non-zero code".
_BK_STEP = re.compile(r"^#(\d+) (\[[^\]]+\] .*)$")
_BK_ERROR = re.compile(r"^#(\d+) ERROR: ")
_LEGACY_STEP = re.compile(r"^(Step \d+/\d+ : .*)$")


def failed_step(lines: list[str]) -> tuple[str, list[str]] | None:
    """The build step that failed and its error lines, from the engine's output."""
    steps: dict[str, str] = {}
    for line in lines:
        head = _BK_STEP.match(line)
        if head and head.group(1) not in steps:
            steps[head.group(1)] = head.group(2)
        error = _BK_ERROR.match(line)
        if error and error.group(1) in steps:
            step = error.group(1)
            said = [
                re.sub(rf"^#{step} [\d.]+ ", "", x)
                for x in lines
                if re.match(rf"^#{step} [\d.]+ .*(ERROR|[Ee]rror)", x)
            ]
            return steps[step], said
    legacy = [m.group(1) for m in map(_LEGACY_STEP.match, lines) if m]
    if legacy and any("returned a non-zero code" in x for x in lines):
        return legacy[-1], [x for x in lines if "ERROR" in x or "error:" in x]
    return None


def failure_message(returncode: int, lines: list[str], log: Path | None) -> str:
    where = f"; log {log}" if log else "; see the output above"
    found = failed_step(lines)
    if found is None:
        tail = "".join(lines[-25:])
        return f"the image build failed (exit {returncode}){where}:\n{tail}"
    step, said = found
    # The step's command, not its --mount options (a BuildKit install's first 300 characters).
    step = re.sub(r"\s+", " ", re.sub(r"--mount=\S+\s+", "", step))
    cause = "; ".join(x.strip()[:300] for x in said[-2:]) or "no error line; see the log"
    return (
        f"the image build failed at step {step[:300]}: {cause}. Fix that (a pin: "
        f"--pin NAME=VERSION; the network: --network, --extra-ca-certs) and build again; "
        f"the steps before it stay in the engine's cache. No image was tagged{where}"
    )


def run_build(argv: list[str], env: dict[str, str], log: Path | None = None) -> None:
    """Run the build, its output to `log` (or the terminal); on failure name the failed step."""
    cli = Cli(argv[0], env)
    if log is None:
        tail: deque[str] = deque(maxlen=2000)
        with cli.started(*argv[1:], out=subprocess.PIPE) as proc:
            for raw in proc.stdout:  # type: ignore[union-attr]
                line = raw.decode(errors="replace")
                sys.stderr.write(line)
                tail.append(line)
        if proc.returncode != 0:
            raise UserError(failure_message(proc.returncode, list(tail), None))
        return
    with log.open("w") as out:
        status = cli.call(*argv[1:], out=out)
    if status != 0:
        lines = gate.tail(log).splitlines(keepends=True)
        raise UserError(failure_message(status, lines, log))


def context_name(target: str, engine: Engine) -> str:
    """The name of the target's context directory for this builder. Builds of one context
    take turns (the engine reads it while it builds: podman at every COPY), so each builder
    has its own and builds of one target with different builders run side by side;
    BuildKit's keeps the target's name."""
    if engine.kind == DOCKER_NAME and engine.buildkit:
        return target
    return f"{target}.{PODMAN_NAME if engine.kind == PODMAN_NAME else 'legacy'}"


@contextmanager
def context_dir(cache: Path, name: str) -> Iterator[Path]:
    """The build context directory `name` (context_name), held under a lock while in use.

    The path stays the same from build to build because BuildKit keys its copy
    of a local context by the directory's path: a fresh temp dir per build made
    it keep one more full copy (the 190 MB torch wheel included) every time,
    tens of GB after a day of builds. Under a stable path it sends only what
    changed.
    """
    path = cache / "contexts" / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = (path.parent / f"{name}.lock").open("w")
    except OSError as err:
        raise UserError(
            f"cannot write build contexts under {path.parent}: {err.strerror}; "
            "set ZENVLLM_CACHE to a directory you can write"
        ) from err
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two builds of one context take turns
        yield path


def build_context(
    engine: Engine,
    context: Path,
    tag: str,
    network: str = "host",
    base_image: str | None = None,
    log: Path | None = None,
    no_cache: bool = False,
) -> str:
    """Build a rendered context; return the image ID."""
    with tempfile.TemporaryDirectory(prefix="zenvllm-iid-") as tmp:
        iidfile = Path(tmp) / "iid"
        argv = build_argv(engine, context, tag, network, base_image, iidfile, no_cache)
        run_build(argv, build_env(engine), log)
        return bare_id(gate.read_text(iidfile, gate.SYSFS, "") or "")


def bare_id(image: str) -> str:
    """An image ID without its digest prefix: podman writes "sha256:..." to --iidfile
    but inspects as bare hex, and comparing the two once removed a fresh image."""
    return image.strip().removeprefix("sha256:")


def image_id(engine: Engine, tag: str) -> str | None:
    done = _run([engine.binary, "image", "inspect", "--format", "{{.Id}}", tag])
    return bare_id(done.stdout) if done.returncode == 0 else None


def remove_image(engine: Engine, image: str) -> bool:
    """Remove an untagged image; an image a container still uses is left alone."""
    return _run([engine.binary, "image", "rm", image]).returncode == 0
