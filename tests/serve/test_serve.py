"""A real completion from each image, run the way a user runs it.

`docker run IMAGE --model /model` with the tiny model mounted read-only, in
vLLM's default compiled mode (torch.compile with Inductor, and for `zen` the
ZenCpuPlatform's zentorch linear ops where the CPU has AVX-512 BF16; for `pace`,
vLLM 0.28 with pace-vllm's platform, libxsmm linears, slab attention and fused MLP
where pace_state says the CPU can run them). Only the launcher sizes the instance
(no VLLM_CPU_* env is passed): the test checks the planned values in its log, then
sends a real /v1/completions and checks the token counts against the model's own
tokenizer.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import require
from support import cpu, engine
from support.cpu import has_amx
from support.tiny_model import ensure_tiny_model

from zenvllm.bench import backend, http_client
from zenvllm.core import observed
from zenvllm.core.accelerators import pace_state
from zenvllm.core.targets import TARGETS, missing_isa
from zenvllm.image import render
from zenvllm.runtime.health import healthy

pytestmark = pytest.mark.serve

MAX_TOKENS = 9
PROMPT = "Hello world, the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module", params=["vllm-openai", "zen", "pace"])
def image(request, tmp_path_factory) -> str:
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")
    tag, _ = engine.build(request.param, tmp_path_factory.mktemp("logs") / "build.log")
    return tag


def target_of(image: str) -> str:
    return engine.image_config(image)["Labels"]["io.zenvllm.target"]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> Path:
    """Where the pace server's torch profiler writes (vLLM's user, uid 10001, must write)."""
    path = tmp_path_factory.mktemp("profiles")
    path.chmod(0o777)
    return path


@pytest.fixture(scope="module")
def server(image, profiles):
    model = ensure_tiny_model()
    port = engine.free_port()
    start = time.monotonic()
    # The project's engine gives containers 1 GiB of /dev/shm (Docker's default is 64 MiB).
    # Labelled as a deployment's container: `zenvllm status` reads it (its test below).
    target = target_of(image)
    opts, extra = (
        ("--health-interval=5s", *engine.planned_as(f"serve-{target}", target, target, port)),
        (),
    )
    if target == "pace":  # vLLM's profiler, idle until the PACE test asks
        opts, extra = (*opts, "-v", f"{profiles}:{backend.PROFILE_MOUNT}"), backend.serve_args()
    with engine.serve(image, model, port, *extra, run_opts=opts) as name:
        engine.wait_for(
            lambda: healthy(port) or "initialization failed" in engine.logs(name),
            420,
            "/health",
            name,
            every=2,
        )
        assert healthy(port), engine.logs(name)
        print(f"server ready in {time.monotonic() - start:.0f} s")
        yield name, port, model


def test_launcher_planned_the_container(server):
    name, _, _ = server
    log = engine.logs(name)
    assert re.search(r"zenvllm-launch: VLLM_CPU_KVCACHE_SPACE=\d+ \(planned\)", log)
    assert re.search(r"zenvllm-launch: VLLM_CPU_OMP_THREADS_BIND=[\d,-]+ \(planned\)", log)
    assert "zenvllm-launch: LD_PRELOAD ok:" in log
    assert "zenvllm-launch: exec vllm serve /model" in log
    # No --dtype given: the launcher chose what this CPU computes natively, and vLLM took it.
    dtype = cpu.serving_dtype()
    assert re.search(rf"zenvllm-launch: plan: dtype {dtype}: .*(natively|neither)", log), log
    assert re.search(rf"zenvllm-launch: exec vllm serve /model .*--dtype={dtype}\b", log), log
    assert f"dtype=torch.{dtype}" in log, log  # vLLM's engine config line
    # AMX tiles asked for at the interpreter's start exactly where this CPU has them.
    amx = "requested at interpreter start (zenvllm.pth) and granted" if has_amx() else "not on"
    assert re.search(rf"zenvllm-launch: AMX: .*{re.escape(amx)}", log), log


def complete(name: str, port: int) -> dict:
    body = {
        "model": "/model",
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
    }
    try:  # the first bf16 request is where a missing AMX permission killed the worker
        return engine.http_json(f"http://127.0.0.1:{port}/v1/completions", body)
    except OSError as err:
        log = engine.logs(name)
        raise AssertionError(f"the completion failed ({err}); server log:\n{log}") from err


def test_completion_has_the_requested_tokens(server):
    from tokenizers import Tokenizer

    name, port, model = server
    reply = complete(name, port)
    usage = reply["usage"]
    prompt_ids = Tokenizer.from_file(str(Path(model) / "tokenizer.json")).encode(PROMPT).ids
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["prompt_tokens"] == len(prompt_ids)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["choices"][0]["text"]


def test_image_healthcheck_reports_healthy(server):
    name, _, _ = server
    status = engine.wait_for(
        lambda: (
            engine.docker("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()
            == "healthy"
        ),
        60,
        "docker's health status",
        name,
    )
    assert status


def test_status_reads_the_backend_vllm_selected(server, image):
    """`zenvllm status` asks the running vLLM which platform it selected: each image's
    own where the CPU runs it (zentorch on AMD with AVX-512 BF16, PACE where its
    kernels run), and vLLM's stock platform, reported as a fallback, where not."""
    target = target_of(image)
    accelerated = {"vllm-openai": True, "zen": cpu.zentorch_active(), "pace": pace_expected()[0]}
    rc, rows, err = engine.status(f"serve-{target}")
    (row,) = rows
    backend_wanted = {"vllm-openai": "stock", "zen": "zentorch", "pace": "pace"}[target]
    if accelerated[target]:
        assert (rc, row["backend"], row["placement"], row["problems"]) == (
            0,
            backend_wanted,
            "ok",
            [],
        ), err
    else:
        assert (rc, row["backend"], row["placement"]) == (1, "stock", "drifted"), err
        assert row["problems"] == [
            f"vLLM runs CpuPlatform (stock), not the {target} target's "
            f"{observed.PLATFORMS[target]}: a silent fallback"
        ]
    assert row["health"] == "ok" and row["model"] == "/model"
    # The AMX permission the launcher obtained (its log), as the launcher test expects it.
    assert row["amx"] == ("granted" if has_amx() else "none"), row
    assert row["numa_local_ratio"] >= observed.LOCAL_MIN


def test_without_enough_shm_the_launcher_refuses_with_the_fix(image):
    # 64m is docker's stock default; the test engine itself defaults to 1g.
    done = engine.docker(
        "run",
        "--rm",
        "--network",
        "host",
        "--shm-size=64m",
        image,
        "--model",
        "/nowhere",
        check=False,
    )
    assert done.returncode == 2
    assert "vLLM needs at least 512 MiB" in done.stderr
    assert "--shm-size=" in done.stderr


def pace_expected() -> tuple[bool, list[str]]:
    """Whether PACE runs on this CPU (the project's rule, which pace-vllm's own matches:
    tests/image/test_build.py) and, where not, what the CPU lacks."""
    needs = render.resolve(render.load_config(), "pace", {}, None).rows["pace-vllm"]["needs"]
    host = cpu.this_host()
    active, _ = pace_state(host, "1.3.0", "0.28.0+cpu", needs["vllm"])
    return active, missing_isa(TARGETS["pace"], host)


def profiled_calls(name: str, port: int, profiles: Path) -> dict[str, int]:
    """Calls per operator in one completion under vLLM's torch profiler (its table)."""
    url = f"http://127.0.0.1:{port}"
    http_client.post(f"{url}/start_profile")
    try:
        assert complete(name, port)["usage"]["completion_tokens"] == MAX_TOKENS
    finally:
        http_client.post(f"{url}/stop_profile")
    (table,) = profiles.glob("*profiler_out*.txt")
    return {r["op"]: r["calls"] for r in backend.parse_table(table.read_text())}


def test_pace_ran_its_operators_where_the_cpu_has_them(server, image, profiles):
    """vLLM's own word, not the launcher's: its platform, its log (pace-vllm's worker and
    attention selected, every linear layer packed for PACE's libxsmm kernel, every MLP
    fused) and its torch profiler around one request (PACE's operators called once per
    layer and step); where the CPU lacks what PACE needs, the launcher and pace-vllm say
    why and vLLM serves on its own CPU platform without them."""
    name, port, model = server
    log = engine.logs(name)
    if target_of(image) != "pace":
        assert "pace-vllm" not in log  # the plugin ships in the pace image only
        return
    calls = profiled_calls(name, port, profiles)
    platform = engine.docker("exec", name, "python", "-c", backend.PLATFORM_CODE).stdout.split()
    log = engine.logs(name)
    active, lacks = pace_expected()
    if not active:
        why = f"pace-vllm 1.3.0 is installed but INACTIVE: this CPU lacks {', '.join(lacks)}"
        assert f"zenvllm-launch: WARNING: {why}" in log, log
        assert "pace-vllm: platform not available on this host; plugin inactive." in log
        assert "PacePlatform active" not in log and "packed into TPP layout" not in log
        assert platform[-1] == "CpuPlatform"
        assert not [op for op in calls if op.startswith("pace::")], calls
        return
    layers = json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"]
    assert platform[-1] == "PacePlatform"
    # One forward pass per token (the prompt's in the first); in each, qkv and o of every
    # layer and the LM head go through libxsmm, and every MLP is one fused call.
    assert calls.get("pace::libxsmmlinear_plain") == MAX_TOKENS * (2 * layers + 1), calls
    assert calls.get("pace::libxsmm_fused_mlp") == MAX_TOKENS * layers, calls
    assert "zenvllm-launch: pace-vllm 1.3.0 is ACTIVE" in log, log
    assert "Platform plugin pace is activated" in log
    assert "attn_backend=pace_vllm.v1.attention.backends.pace_attn.PaceAttentionBackend" in log
    assert "pace-vllm: PaceWorker active (worker=PaceWorker, model_runner=PaceModelRunner)" in log
    # qkv, o, gate_up and down in each layer; none fell back to vLLM's own matmul.
    packed = re.findall(r"pace-vllm: Linear model\.layers\.\d+\.\S+ packed into TPP", log)
    assert len(packed) == 4 * layers, log
    assert "falling back to stock CPU dispatch" not in log
    # The pass runs while vLLM compiles: a start from a warm compile cache loads what it
    # made instead, and the fused calls profiled above are then the proof.
    if "zenvllm-launch: compile cache: warm" not in log:
        assert f"pace-vllm: FusedMLPPass matched {layers} MLP sites." in log
    assert "pace-vllm: slab lifecycle step: +1 new" in log  # PACE's runner took the request


def test_pace_serves_where_pace_is_inactive(tmp_path):
    """The other branch on every machine: under a faked Zen 3 /proc/cpuinfo (AVX2 only)
    the pace image still serves, on vLLM 0.28's own CPU platform, and says why."""
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")
    tag, _ = engine.build("pace", tmp_path / "build.log")  # the layer cache's hit
    view = tmp_path / "cpuinfo"
    view.write_text(cpu.fake_cpuinfo("amd-zen3-avx2", len(cpu.this_host().cpus)))
    port = engine.free_port()
    run_opts = ("-v", f"{view}:/proc/cpuinfo:ro")
    with engine.serve(tag, ensure_tiny_model(), port, "--enforce-eager", run_opts=run_opts) as name:
        engine.wait_for(lambda: healthy(port), 420, "/health", name)
        assert complete(name, port)["usage"]["completion_tokens"] == MAX_TOKENS
        log = engine.logs(name)
    lacks = ", ".join(missing_isa(TARGETS["pace"], cpu.fake_host("amd-zen3-avx2")))
    assert f"pace-vllm 1.3.0 is installed but INACTIVE: this CPU lacks {lacks}" in log, log
    assert "pace-vllm: platform not available on this host; plugin inactive." in log
    assert "PacePlatform active" not in log


# In the image's venv, under a memory limit: 256 MiB of file pages charged to the
# container, then vLLM's own reading of the cgroup's usage before and after its plugins.
WORKING_SET_PROBE = """
import json, os
from importlib.metadata import entry_points
from vllm.plugins import load_general_plugins
from vllm.utils import cpu_resource_utils as resources
with open("/tmp/pages", "wb") as f:
    for _ in range(256):
        f.write(os.urandom(1 << 20))
    f.flush()
    os.fsync(f.fileno())
read = getattr(resources, "get_cgroup_memory_usage", lambda: None)
before = read()
load_general_plugins()
read = getattr(resources, "get_cgroup_memory_usage", lambda: None)
names = [e.name for e in entry_points(group="vllm.general_plugins")]
print(json.dumps({"plugins": names, "before": before, "after": read()}))
"""


def test_vllm_reads_the_containers_memory_without_its_page_cache(image):
    """The plans' memory limits leave no room for the weight files' page cache
    (runtime/working_set.py): the image's vLLM must read the cgroup's usage less its file
    pages, or it refuses the KV cache of a model whose files fill the limit."""
    done = engine.docker(
        "run", "--rm", "--memory=1g", "--entrypoint", "python", image, "-c", WORKING_SET_PROBE
    )
    probe = json.loads(done.stdout.splitlines()[-1])
    assert "zenvllm_working_set" in probe["plugins"], probe
    if target_of(image) == "pace":  # vLLM 0.28 reads its usage once, cached: left as it is
        assert probe["before"] is None and probe["after"] is None, probe
        return
    assert probe["before"] >= 256 * 2**20, probe  # vLLM alone counts the file pages as used
    assert probe["before"] - probe["after"] >= 200 * 2**20, probe
