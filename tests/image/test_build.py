"""Real builds with the real engine: the base image, vllm-openai, zen and pace, the cache,
zentorch and PACE.

The images built here are kept (tags zenvllm/vllm-openai:0.32.0, zenvllm/zen:0.32.0
and zenvllm/pace:0.28.0): the serve, ansible, bench and reliability tiers reuse
them, and the next run is a layer-cache hit. Containers are always removed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, require, require_tool
from support import cpu, engine, readme
from support.tiny_model import ensure_tiny_model

from zenvllm.core.accelerators import pace_state
from zenvllm.core.targets import TARGETS, missing_isa
from zenvllm.image import render
from zenvllm.image.build import PODMAN_ULIMITS

pytestmark = pytest.mark.image


@pytest.fixture(scope="module", autouse=True)
def _engine():
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("build-logs")


@pytest.fixture(scope="module")
def openai_image(logdir) -> str:
    tag, seconds = engine.build("vllm-openai", logdir / "vllm-openai.log")
    print(f"vllm-openai build: {seconds:.1f} s")
    return tag


@pytest.fixture(scope="module")
def zen_image(logdir, openai_image) -> str:
    tag, seconds = engine.build("zen", logdir / "zen.log")
    print(f"zen build: {seconds:.1f} s")
    return tag


@pytest.fixture(scope="module")
def pace_image(logdir, openai_image) -> str:
    # After vllm-openai: its os stage and BuildKit's uv cache are then shared.
    tag, seconds = engine.build("pace", logdir / "pace.log")
    print(f"pace build: {seconds:.1f} s")
    return tag


def test_base_image_is_a_local_debian(openai_image):
    base = render.load_config()["defaults"]["base_image"]
    os_release = engine.docker("run", "--rm", "--network", "host", base, "cat", "/etc/os-release")
    assert "VERSION_CODENAME=bookworm" in os_release.stdout


def test_vllm_openai_image_records_pins_and_runs_as_non_root(openai_image):
    config = engine.image_config(openai_image)
    labels = config["Labels"]
    assert labels["io.zenvllm.pin.vllm"] == "0.32.0"
    assert labels["io.zenvllm.pin.torch"] == "2.13.0+cpu"
    assert labels["io.zenvllm.target"] == "vllm-openai"
    assert config["User"] == "10001"
    assert config["Entrypoint"] == ["/opt/venv/bin/python", "-m", "zenvllm.runtime.launcher"]
    assert config["Healthcheck"]["Test"][-1] == "zenvllm.runtime.health"


def test_runtime_has_preloads_metadata_and_inductors_compiler_not_dropped_packages(openai_image):
    script = (
        "import importlib.metadata as md, importlib.util as u, os;"
        "print(md.version('vllm'));"
        "print([n for n in ('torchvision','torchaudio','torchcodec','triton') if u.find_spec(n)]);"
        "print(all(os.path.exists(p) for p in os.environ['LD_PRELOAD'].split(':')));"
        "print(os.path.exists('/usr/bin/g++'))"
    )
    out = engine.python_in(openai_image, script)
    # g++ stays: torch.compile (Inductor) compiles C++ kernels at run time on the CPU.
    assert out == ["0.32.0+cpu", "[]", "True", "True"]


def test_a_second_build_with_no_change_is_a_cache_hit(openai_image, logdir):
    before = engine.image_id(openai_image)
    tag, seconds = engine.build("vllm-openai", logdir / "again.log")
    log = (logdir / "again.log").read_text()
    assert engine.image_id(tag) == before
    # BuildKit marks reused steps CACHED, the legacy builder "Using cache"; no step ran.
    assert "CACHED" in log or "Using cache" in log
    assert not re.search(r"^#\d+ \d+\.\d+ ", log, re.M), "a step ran again"
    print(f"cached rebuild: {seconds:.1f} s")


# What the legacy and podman builds must agree on with the BuildKit image.
RUNTIME_CHECK = (
    "import importlib.metadata as md, os;"
    "print(md.version('vllm'), md.version('torch'));"
    "print(all(os.path.exists(p) for p in os.environ['LD_PRELOAD'].split(':')))"
)
RUNTIME = ["0.32.0+cpu", "2.13.0+cpu", "True"]


PODMAN_TAG = "zenvllm/vllm-openai:podman-test"


@pytest.fixture(scope="module")
def other_builders(openai_image, logdir) -> Iterator[dict[str, Future]]:
    """The legacy builder's and podman's builds of vllm-openai, started together: each
    is a whole build of its own on a fresh machine (no BuildKit cache), much of it
    downloads, unpacking and layer commits, so side by side they take less time than
    one after the other. Tagged apart and kept, so the next run is a cache hit."""
    builds = {
        "legacy": ("--builder", "legacy", "--tag", "zenvllm/vllm-openai:legacy-test"),
        "podman": ("--engine", "podman", "--tag", PODMAN_TAG),
    }
    if shutil.which("podman") is None:
        del builds["podman"]  # its test says so (require_tool)
    with ThreadPoolExecutor(max_workers=len(builds)) as pool:
        yield {
            name: pool.submit(engine.build, "vllm-openai", logdir / f"{name}.log", *args)
            for name, args in builds.items()
        }


def test_the_legacy_builder_makes_the_same_runtime(openai_image, logdir, other_builders):
    # For engines without BuildKit: the template drops its cache mounts, the rest holds.
    tag, seconds = other_builders["legacy"].result()
    log = (logdir / "legacy.log").read_text()
    assert re.search(r"^Step \d+/\d+ : ", log, re.M) and "--mount=type=cache" not in log
    legacy, buildkit = engine.image_config(tag), engine.image_config(openai_image)
    for key in ("User", "Entrypoint", "Healthcheck", "Labels"):
        assert legacy[key] == buildkit[key], key
    assert engine.python_in(tag, RUNTIME_CHECK) == RUNTIME
    print(f"legacy build: {seconds:.1f} s")


def test_podman_builds_the_same_image_keeps_it_on_a_rebuild_and_serves(
    openai_image, logdir, other_builders
):
    podman = require_tool("podman")
    tag = PODMAN_TAG
    _, seconds = other_builders["podman"].result()
    print(f"podman build (first): {seconds:.1f} s")
    # A no-change rebuild once deleted the image.
    _, seconds = engine.build(
        "vllm-openai", logdir / "podman-again.log", "--engine", "podman", "--tag", tag
    )
    print(f"podman build (again): {seconds:.1f} s")

    def run(*args: str) -> str:
        done = subprocess.run([podman, *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    built = json.loads(run("image", "inspect", tag))[0]
    buildkit = engine.image_config(openai_image)
    assert built["Healthcheck"] == buildkit["Healthcheck"]  # kept: the build asks for docker format
    ours = {k: v for k, v in built["Labels"].items() if not k.startswith("io.buildah.")}
    assert ours == buildkit["Labels"]
    assert built["Config"]["User"] == buildkit["User"]
    assert built["Config"]["Entrypoint"] == buildkit["Entrypoint"]
    out = run(
        *("run", "--rm", "--network", "none", "--entrypoint", "python", *PODMAN_ULIMITS),
        *(tag, "-c", RUNTIME_CHECK),
    )
    assert out.split() == RUNTIME

    # `podman run IMAGE --model DIR` serves; podman's /dev/shm is 64m, so --shm-size as
    # on a stock docker engine.
    port = engine.free_port()
    name = f"zenvllm-test-podman-{port}"
    run(
        *("run", "-d", "--name", name, "--network", "host", "--shm-size", "1g", *PODMAN_ULIMITS),
        *("-v", f"{ensure_tiny_model()}:/model:ro", tag),
        *("--model", "/model", "--port", str(port), "--max-model-len", "512", "--enforce-eager"),
    )

    def served() -> dict | None:
        if run("inspect", "--format", "{{.State.Running}}", name).strip() != "true":
            logs = subprocess.run([podman, "logs", name], capture_output=True, text=True)
            raise AssertionError(f"the podman container exited:\n{logs.stdout}{logs.stderr}")
        return _completion(port)

    try:
        reply = engine.wait_for(served, 300, "a completion from the podman container")
        assert reply["usage"]["completion_tokens"] == 4
    finally:
        subprocess.run([podman, "rm", "-f", name], capture_output=True, check=False)


def _completion(port: int) -> dict | None:
    body = {"model": "/model", "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
    try:
        return engine.http_json(f"http://127.0.0.1:{port}/v1/completions", body, timeout=30)
    except OSError:
        return None


def test_make_image_as_the_images_page_says_finds_both_images_built(openai_image, zen_image):
    """docs/how-to/images.md's `make image` lines from the checkout's root, as written,
    after this module built both: each is a layer-cache hit that tags the same image."""

    def image_id(tag: str) -> str:
        return engine.docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()

    ids = {tag: image_id(tag) for tag in (openai_image, zen_image)}
    done = readme.run("make-image", cwd=REPO, env=engine.engine_env(), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {tag: image_id(tag) for tag in ids} == ids
    for tag, built in ids.items():  # the tag on stdout, the build's line on stderr
        assert tag in done.stdout.splitlines(), done.stdout
        assert f"build: {tag} {built.removeprefix('sha256:')} in " in done.stderr


def test_zen_image_has_zentorch_at_the_matrix_version(zen_image):
    labels = engine.image_config(zen_image)["Labels"]
    assert labels["io.zenvllm.pin.zentorch"] == "2.13.0.1"
    version = engine.python_in(
        zen_image,
        "import importlib.metadata as md; print(md.version('zentorch'), md.version('torch'))",
    )
    assert version == ["2.13.0.1", "2.13.0+cpu"]


def test_zen_starts_and_logs_zentorch_state_as_the_cpu_flags_say(zen_image):
    # This machine's CPU decides; the other kinds run on faked views (test_cpu_kinds.py).
    host, active = cpu.this_host(), cpu.zentorch_active()
    model = ensure_tiny_model()
    port = engine.free_port()
    with engine.serve(zen_image, model, port, "--enforce-eager") as name:
        line = engine.wait_for(
            lambda: re.search(r"zenvllm-launch: ((?:WARNING: )?zentorch .*)", engine.logs(name)),
            120,
            "the launcher's zentorch line",
            name,
        ).group(1)
        platform = re.search(r"zenvllm-launch: vLLM platform: (.*)", engine.logs(name)).group(1)
        if active:
            assert line.startswith("zentorch 2.13.0.1 is ACTIVE"), line
            assert platform.startswith("ZenCpuPlatform"), platform
        else:
            assert line.startswith("WARNING: zentorch 2.13.0.1 is installed but INACTIVE"), line
            why = "avx512" if host.vendor == "AuthenticAMD" else f"this CPU is {host.vendor}"
            assert why in line and platform.startswith("CpuPlatform"), platform
    # vLLM itself must agree with the launcher: ask it which platform it picks.
    picked = engine.python_in(
        zen_image, "from vllm.platforms import current_platform as p; print(type(p).__name__)"
    )[-1]
    assert picked == ("ZenCpuPlatform" if active else "CpuPlatform")


def test_pace_image_has_pace_vllm_over_its_own_vllm_pin(pace_image):
    labels = engine.image_config(pace_image)["Labels"]
    assert labels["io.zenvllm.target"] == "pace"
    assert labels["io.zenvllm.pin.pace-vllm"] == "1.3.0"
    assert labels["io.zenvllm.pin.vllm"] == "0.28.0"  # pace-vllm 1.3.0 stops at vLLM 0.28
    versions = engine.python_in(
        pace_image,
        "import importlib.metadata as md;"
        "print(*(md.version(n) for n in ('pace-vllm', 'vllm', 'torch')))",
    )
    assert versions == ["1.3.0", "0.28.0+cpu", "2.13.0+cpu"]


PACE_SPEC = render.resolve(render.load_config(), "pace", {}, None).rows["pace-vllm"]["needs"]


@pytest.mark.parametrize("kind", ["this-cpu", *cpu.KINDS])
def test_pace_is_active_exactly_where_pace_state_says(pace_image, kind, tmp_path):
    """The launcher's PACE line and vLLM's own platform choice, on this CPU and under a
    faked /proc/cpuinfo of every kind: both follow pace_state, never the vendor alone."""
    host, opts = cpu.this_host(), ["--network", "none"]
    if kind != "this-cpu":
        host = cpu.fake_host(kind)
        view = tmp_path / "cpuinfo"
        view.write_text(cpu.fake_cpuinfo(kind, len(cpu.this_host().cpus)))
        opts += ["-v", f"{view}:/proc/cpuinfo:ro"]
    active, _ = pace_state(host, "1.3.0", "0.28.0+cpu", PACE_SPEC["vllm"])
    launched = engine.docker(
        *("run", "--rm", *opts, "-e", "ZENVLLM_DRY_RUN=1"),
        *("-v", f"{ensure_tiny_model()}:/model:ro", pace_image, "--model", "/model"),
        check=False,
    )
    assert launched.returncode == 0, launched.stderr
    if active:
        assert "zenvllm-launch: pace-vllm 1.3.0 is ACTIVE" in launched.stderr, launched.stderr
    else:
        lacks = ", ".join(missing_isa(TARGETS["pace"], host))
        why = f"WARNING: pace-vllm 1.3.0 is installed but INACTIVE: this CPU lacks {lacks}"
        assert f"zenvllm-launch: {why}" in launched.stderr, launched.stderr
    picked = engine.docker(
        *("run", "--rm", *opts, "--entrypoint", "python", pace_image),
        *("-c", "from vllm.platforms import current_platform as p; print(type(p).__name__)"),
    )
    assert picked.stdout.split()[-1] == ("PacePlatform" if active else "CpuPlatform")
    # pace-vllm says why in vLLM's log too, where it stays out.
    plugin = (
        "plugin active, PacePlatform registered"
        if active
        else "platform not available on this host; plugin inactive"
    )
    assert f"pace-vllm: {plugin}" in picked.stdout + picked.stderr
