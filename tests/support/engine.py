"""Test helpers around the real container engine: build images, run and clean up containers.

Images are built with the project's own `zenvllm build` (so tests exercise the
CLI) and kept: they are the cached artefacts other tiers reuse. Containers are
always removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from zenvllm.bench.servers import CONTAINER_USER
from zenvllm.core import compile_cache
from zenvllm.core.errors import UserError
from zenvllm.core.topology import format_cpu_list
from zenvllm.runtime.engine import Cli

REPO = Path(__file__).resolve().parent.parent.parent
ZENVLLM = [sys.executable, "-m", "zenvllm"]
# The serve and image tiers' compile caches, kept between runs under $ZENVLLM_CACHE.
COMPILE_CACHES = "compile-serve"
WHEELHOUSE = os.environ.get("ZENVLLM_WHEELHOUSE", "/opt/wheels")
EXTRA_CA = os.environ.get("ZENVLLM_EXTRA_CA_CERTS", "/usr/local/share/ca-certificates")


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DOCKER_HOST", "unix:///run/zenvllm/docker.sock")
    env.setdefault("ZENVLLM_CACHE", "/var/cache/zenvllm")
    env["PYTHONPATH"] = str(REPO / "scripts")
    return env


def docker(
    *args: str, check: bool = True, timeout: float | None = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`docker ARGS` through the package's engine runner, output captured as text, in
    `env` (default: engine_env() at the call); `check` raises CalledProcessError."""
    done = Cli("docker", env if env is not None else engine_env()).run(*args, timeout=timeout)
    if check:
        done.check_returncode()
    return done


def python_in(image: str, code: str) -> list[str]:
    """Run Python code in a throwaway container of the image; its stdout, split."""
    done = docker("run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c", code)
    return done.stdout.split()


def engine_ready() -> bool:
    try:
        return docker("version", "--format", "{{.Server.Version}}", check=False).returncode == 0
    except (OSError, UserError, subprocess.TimeoutExpired):  # UserError: no docker binary
        return False


def build_args(target: str) -> list[str]:
    args = [*ZENVLLM, "build", "--target", target]
    if Path(WHEELHOUSE).is_dir():
        args += ["--wheelhouse", WHEELHOUSE]
    if Path(EXTRA_CA).exists():
        args += ["--extra-ca-certs", EXTRA_CA]
    return args


def build(target: str, log: Path, *extra: str, timeout: float = 1800) -> tuple[str, float]:
    """Build `target` with `zenvllm build [extra...]`; return (tag, seconds)."""
    start = time.monotonic()
    done = subprocess.run(
        [*build_args(target), "--log", str(log), *extra],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"zenvllm build {target} failed:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1], time.monotonic() - start


def image_id(tag: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def saved_archive_of(path: Path, tag: str) -> bool:
    """Whether `path` is a whole `docker save` archive of `tag` (its manifest names the
    tag): what image_archive writes, and all it ever replaces."""
    try:
        with tarfile.open(path) as tar:
            member = tar.extractfile("manifest.json")
            manifest = json.load(member) if member else []
    except (OSError, tarfile.TarError, KeyError, ValueError):
        return False
    return any(tag in (entry.get("RepoTags") or []) for entry in manifest)


def image_archive(tag: str) -> Path:
    """`docker save` of the image (about a minute for vllm-openai's 3 GB), kept in
    $ZENVLLM_CACHE/archives by the image's ID, for the test hosts to load; an archive
    of an older build of the same tag is replaced. A file there that is not such an
    archive is never read as one nor removed."""
    short = image_id(tag).split(":")[-1][:12]
    stem = tag.replace("/", "_").replace(":", "_")
    cache = Path(engine_env()["ZENVLLM_CACHE"]) / "archives"
    path = cache / f"{stem}-{short}.tar"
    if path.exists():
        assert saved_archive_of(path, tag), f"{path} is not a docker save archive of {tag}"
        return path
    cache.mkdir(parents=True, exist_ok=True)
    for old in cache.glob(f"{stem}-*.tar"):
        if saved_archive_of(old, tag):  # an older build's, by its manifest
            old.unlink()
    handle, name = tempfile.mkstemp(dir=cache, prefix=f".{stem}-", suffix=".part")
    os.close(handle)
    part = Path(name)  # this run's own file: whole at `path`, or gone
    try:
        docker("save", "-o", str(part), tag, timeout=900)
        part.rename(path)
    finally:
        part.unlink(missing_ok=True)
    return path


def image_config(tag: str) -> dict:
    return json.loads(docker("image", "inspect", tag).stdout)[0]["Config"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def container(image: str, *args: str, run_opts: tuple[str, ...] = ()) -> Iterator[str]:
    """Run a detached container (host network) and always remove it."""
    name = f"zenvllm-test-{uuid.uuid4().hex[:8]}"
    docker("run", "-d", "--name", name, "--network", "host", *run_opts, image, *args)
    try:
        yield name
    finally:
        docker("rm", "-f", name, check=False)


def serve(
    image: str,
    model: Path,
    port: int,
    *extra: str,
    run_opts: tuple[str, ...] = (),
    keep_compiled: bool = True,
):
    """`docker run IMAGE --model /model` as a user runs it: the model mounted read-only,
    no --shm-size and no VLLM_CPU_* env (the launcher plans them), `extra` vLLM arguments
    after the usual ones, and a compile cache volume, as the launcher asks for (kept
    between runs: kept_compile_cache; keep_compiled=False where a start's time is
    measured). A context manager, like `container`."""
    # Keyed by what is served, not by the port or the run's paths: the same next run.
    cache = (
        ("-v", f"{kept_compile_cache(image, str(model), *extra)}:{CACHE_MOUNT}")
        if keep_compiled
        else ()
    )
    return container(
        image,
        *("--model", "/model", "--port", str(port), "--max-model-len", "512"),
        *extra,  # no --dtype: the launcher serves what this CPU computes natively
        run_opts=(*run_opts, *cache, "-v", f"{model}:/model:ro"),
    )


CACHE_MOUNT = compile_cache.CONTAINER_DIR


def for_the_image_user(path: Path | str) -> Path:
    """`path` made (with its parents) and owned by the image's user, as the instances
    role and the bench make the directories a container writes (servers.CONTAINER_USER)."""
    made = Path(path)
    made.mkdir(parents=True, exist_ok=True)
    os.chown(made, *CONTAINER_USER)
    return made


def kept_compile_cache(image: str, *what: str) -> Path:
    """A compile cache directory kept between runs, owned by the image's user: one per
    image build (its ID) and per server (`what` it serves), so a second run of a tier
    starts warm, as a deployment's restart does. vLLM and Inductor key what they compile
    inside it. A build's directory carries compile_cache's mark file, as a deployment's
    does; a marked one of a build the engine no longer has is removed, anything else
    there is left alone."""
    root = Path(engine_env()["ZENVLLM_CACHE"]) / COMPILE_CACHES
    build = image_id(image).split(":")[-1][:12]
    for old in root.iterdir() if root.is_dir() else ():
        if old.name != build and marked(old) and not docker_has_image(old.name):
            shutil.rmtree(old, ignore_errors=True)
    for_the_image_user(root / build)
    (root / build / compile_cache.MARK_FILE).write_text(
        f"{compile_cache.MARK} the serve and image tiers' compile caches of image {build}\n"
    )
    return for_the_image_user(
        root / build / hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]
    )


def marked(directory: Path) -> bool:
    """Whether the directory (not a link) carries compile_cache's mark: ours to remove."""
    mark = directory / compile_cache.MARK_FILE
    if directory.is_symlink() or not directory.is_dir() or not mark.is_file():
        return False
    with contextlib.suppress(OSError), mark.open("rb") as f:
        return f.read(100).startswith(compile_cache.MARK.encode())
    return False


def docker_has_image(ref: str) -> bool:
    return docker("image", "inspect", ref, check=False).returncode == 0


def logs(name: str) -> str:
    done = docker("logs", name, check=False)
    return done.stdout + done.stderr


def vllm_of(name: str) -> int:
    """The process group of a container's vLLM: its launcher's (the container's PID 1)
    one child, which runs in a group of its own (runtime/group.py)."""
    launcher = docker("inspect", "-f", "{{.State.Pid}}", name).stdout.strip()
    (child,) = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    return int(child)


def running(name: str) -> bool:
    done = docker("inspect", "--format", "{{.State.Running}}", name, check=False)
    return done.stdout.strip() == "true"


def wait_for(predicate, timeout: float, what: str, name: str | None = None, every: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if name and not running(name):
            # The whole log, stdout and stderr: the cause is rarely in the last lines.
            raise AssertionError(f"container exited while waiting for {what}:\n{logs(name)}")
        time.sleep(every)
    log = logs(name) if name else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{log}")


def http_json(url: str, body: dict | None = None, timeout: float = 60) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            return json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as err:  # the same error, its body in the message
        body = err.read(4000)
        message = f"{err.msg}: {body.decode(errors='replace')}"
        copy = io.BytesIO(body)
        raise urllib.error.HTTPError(url, err.code, message, err.headers, copy) from None


def planned_as(deployment: str, name: str, target: str, port: int) -> tuple[str, ...]:
    """run options that make a test's container one zenvllm status reads as planned:
    core/container.py's labels, on every CPU of this machine and memory node 0."""
    cpus = format_cpu_list(os.sched_getaffinity(0))
    labels = {
        "managed": "true",
        "deployment": deployment,
        "instance": name,
        "port": str(port),
        "cpus": cpus,
        "mems": "0",
        "target": target,
    }
    return (
        *(f"--label=zenvllm.{k}={v}" for k, v in labels.items()),
        f"--cpuset-cpus={cpus}",
        "--cpuset-mems=0",
    )


def status(deployment: str) -> tuple[int, list[dict], str]:
    """`zenvllm status --json` of one deployment, as an operator runs it on the host."""
    done = subprocess.run(
        [sys.executable, "-m", "zenvllm.runtime", "status", "--json", "--deployment", deployment],
        capture_output=True,
        text=True,
        timeout=300,
        env=engine_env(),
    )
    rows = json.loads(done.stdout) if done.returncode in (0, 1) else []
    return done.returncode, rows, done.stderr
