"""The image launcher, run against fixture hosts: arguments, env contract, runtime checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.tiny_model import ensure_tiny_model

from zenvllm.core import accelerators
from zenvllm.core.errors import UserError
from zenvllm.core.topology import read_host
from zenvllm.runtime import launcher


@pytest.fixture(scope="module")
def zen4(fixtures_dir):
    return read_host(fixtures_dir / "test-machine-zen4-2cpu")


@pytest.fixture(scope="module")
def milan(fixtures_dir):
    return read_host(fixtures_dir / "vm-milan-8vcpu-avx2")


@pytest.fixture(scope="module")
def spr(fixtures_dir):
    return read_host(fixtures_dir / "xeon-8480-spr-amx")


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "/m", "--port", "9"],
        ["--model=/m", "--port", "9"],
        ["/m", "--port", "9"],
        ["serve", "/m", "--port", "9"],
        ["vllm", "serve", "--model", "/m", "--port", "9"],
    ],
)
def test_model_flag_becomes_vllm_serves_positional(argv):
    serve = launcher.parse_args(argv)
    assert launcher.vllm_argv(serve, "8000") == ["vllm", "serve", "/m", "--port", "9"]


def test_port_is_added_only_when_not_given():
    serve = launcher.parse_args(["--model", "/m", "--dtype", "bfloat16"])
    assert launcher.vllm_argv(serve, "8000")[-2:] == ["--port", "8000"]


def test_no_model_is_a_user_error():
    with pytest.raises(UserError, match="no model given"):
        launcher.parse_args(["--port", "8000"])


def test_explicit_env_wins_over_the_plan():
    merged, lines = launcher.merge_env(
        {"VLLM_CPU_KVCACHE_SPACE": "7"},
        {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1"},
    )
    assert merged == {"VLLM_CPU_KVCACHE_SPACE": "7", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert "VLLM_CPU_KVCACHE_SPACE=7 (from the environment; plan said 1)" in lines
    assert "VLLM_CPU_OMP_THREADS_BIND=0-1 (planned)" in lines


def test_missing_preloads_are_named(tmp_path):
    lib = tmp_path / "libfake.so"
    lib.write_bytes(b"")
    assert launcher.missing_preloads(f"{lib}:/nope/libiomp5.so") == ["/nope/libiomp5.so"]
    assert launcher.missing_preloads("") == []


def test_zentorch_active_on_zen4_with_avx512_bf16(zen4):
    active, message = accelerators.zentorch_state(zen4, "2.13.0.1", "2.13.0+cpu")
    assert active and "ACTIVE" in message and "ZenCpuPlatform" in message


def test_zentorch_inactive_without_avx512(milan):
    active, message = accelerators.zentorch_state(milan, "2.13.0.1", "2.13.0+cpu")
    assert not active
    assert "INACTIVE" in message and "avx512f, avx512_bf16" in message


def test_zentorch_inactive_on_intel(spr):
    active, message = accelerators.zentorch_state(spr, "2.13.0.1", "2.13.0+cpu")
    assert not active and "vendor AuthenticAMD (this CPU is GenuineIntel)" in message


def test_zentorch_inactive_on_a_torch_it_was_not_built_for(zen4):
    active, message = accelerators.zentorch_state(zen4, "2.14.0.1", "2.13.0+cpu")
    assert not active and "needs torch 2.14.x, found torch 2.13.0+cpu" in message


def test_pace_inactive_outside_its_vllm_range(zen4):
    active, message = accelerators.pace_state(zen4, "1.3.0", "0.32.0+cpu", ">=0.25.0,<=0.28.0")
    assert not active and "supports vLLM >=0.25.0,<=0.28.0, found 0.32.0+cpu" in message
    assert accelerators.pace_state(zen4, "1.3.0", "0.28.0+cpu", ">=0.25.0,<=0.28.0")[0]


def test_small_shm_is_refused_with_the_fix():
    assert launcher.shm_problem(64 << 20, 1024) == (
        "/dev/shm has 64 MiB free but vLLM needs at least 512 MiB for its message queues; "
        "run the container with --shm-size=1024m (the plan's size) or --ipc=host"
    )
    assert launcher.shm_problem(1 << 30, 1024) is None


@pytest.mark.parametrize("bind", ["", "auto", "nobind", "0-1", "0|1", "1"])
def test_binds_within_the_container_pass(bind):
    assert launcher.bind_problem(bind, frozenset({0, 1})) is None


def test_a_bind_outside_the_containers_cpus_is_refused_with_the_fix():
    assert launcher.bind_problem("0-3|99", frozenset({0, 1})) == (
        "VLLM_CPU_OMP_THREADS_BIND=0-3|99 names CPU(s) 2-3,99 outside this container's "
        "CPUs 0-1, which OpenMP would skip and then run unbound; bind within them or "
        "leave it unset for the planned binding"
    )
    message = launcher.bind_problem("cores 0 to 3", frozenset({0, 1}))
    assert message.startswith("VLLM_CPU_OMP_THREADS_BIND='cores 0 to 3' is not a CPU list")


def test_prepare_refuses_an_explicit_bind_outside_the_container(zen4, monkeypatch):
    monkeypatch.setattr(launcher, "shm_free", lambda path="/dev/shm": 1 << 30)
    env = {"LD_PRELOAD": "", "VLLM_CPU_OMP_THREADS_BIND": "8-15"}
    with pytest.raises(UserError, match="CPU\\(s\\) 8-15 outside this container's CPUs 0-1"):
        launcher.prepare(["--model", "/m"], env, zen4, {})


def test_prepare_plans_the_container_and_keeps_explicit_env(zen4, tmp_path, monkeypatch):
    model = ensure_tiny_model()
    monkeypatch.setattr(launcher, "shm_free", lambda path="/dev/shm": 1 << 30)
    env = {"LD_PRELOAD": "", "VLLM_CPU_OMP_THREADS_BIND": "1", "ZENVLLM_TARGET": "zen"}
    argv = launcher.prepare(
        ["--model", str(model), "--max-model-len", "512"], env, zen4, {"port": 8000}
    )
    assert argv == [
        *("vllm", "serve", str(model), "--max-model-len", "512"),
        *("--dtype=bfloat16", "--port", "8000"),  # zen4 computes bf16 natively
    ]
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"  # explicit wins
    assert int(env["VLLM_CPU_KVCACHE_SPACE"]) >= 1  # planned
    assert env["VLLM_ZENTORCH_WEIGHT_PREPACK"] == "1"  # the zen target's tuning
    assert env["HF_HUB_OFFLINE"] == "1"  # a local model needs no hub


@pytest.mark.parametrize("host", ["spr", "milan"])
def test_zen_where_zentorch_cannot_run_serves_and_says_why_loudly(host, request, monkeypatch):
    # Any one CPU kind must not stop the zen image: it serves as vllm-openai would.
    lines = []
    monkeypatch.setattr(launcher, "log", lines.append)
    monkeypatch.setattr(launcher, "shm_free", lambda path="/dev/shm": 1 << 30)
    monkeypatch.setattr(launcher, "installed", {"zentorch": "2.13.0.1", "torch": "2.13.0+cpu"}.get)
    env = {"LD_PRELOAD": "", "ZENVLLM_TARGET": "zen"}
    argv = launcher.prepare(["--model", "/m"], env, request.getfixturevalue(host), {})
    assert argv[:3] == ["vllm", "serve", "/m"]
    assert any(ln.startswith("plan: target zen needs") for ln in lines), lines
    warning = next(ln for ln in lines if "zentorch" in ln)
    assert warning.startswith("WARNING: zentorch 2.13.0.1 is installed but INACTIVE"), warning
    assert lines[-1].startswith("vLLM platform: CpuPlatform")


def test_prepare_refuses_a_missing_preload(zen4, monkeypatch):
    monkeypatch.setattr(launcher, "shm_free", lambda path="/dev/shm": 1 << 30)
    env = {"LD_PRELOAD": "/nope/libtcmalloc_minimal.so.4"}
    with pytest.raises(UserError, match="LD_PRELOAD names missing libraries: /nope/"):
        launcher.prepare(["--model", "/m"], env, zen4, {})


def test_manifest_is_optional(tmp_path):
    assert launcher.read_manifest(tmp_path / "absent.json") == {}
    (tmp_path / "image.json").write_text(json.dumps({"target": "zen"}))
    assert launcher.read_manifest(Path(tmp_path / "image.json"))["target"] == "zen"


def test_platform_line_follows_vllms_rule(zen4, milan, spr):
    assert accelerators.vllm_picks_zen(zen4, "2.13.0.1")
    assert not accelerators.vllm_picks_zen(zen4, None)
    assert not accelerators.vllm_picks_zen(milan, "2.13.0.1")  # no avx512
    assert not accelerators.vllm_picks_zen(spr, "2.13.0.1")  # not AMD
    assert accelerators.platform_line(milan, False, False) == (
        "vLLM platform: CpuPlatform (cpu) with its AVX2 kernels"
    )


def promise_for(host, **change):
    import dataclasses

    from zenvllm.core import deployed

    fields = {"name": "zenvllm-e2e-0", "target": "vllm-openai", "cpus": "0-1", "mems": "0"}
    promise = deployed.Promise(**fields, shm_mib=1024, memory_mib=5120)
    return deployed.encode(dataclasses.replace(promise, **change))


@pytest.fixture
def capped(zen4):
    import dataclasses

    return dataclasses.replace(zen4, cgroup_mem_limit_bytes=5120 << 20)


def test_a_deployed_container_is_validated_not_replanned(capped, monkeypatch):
    lines = []
    monkeypatch.setattr(launcher, "log", lines.append)
    monkeypatch.setattr(launcher, "shm_free", lambda path="/dev/shm": 1 << 30)
    monkeypatch.setattr(launcher, "shm_total_mib", lambda path="/dev/shm": 1024)
    env = {
        "LD_PRELOAD": "",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "ZENVLLM_PLAN": promise_for(capped),
    }
    launcher.prepare(["--model", "/m"], env, capped, {})
    assert "validated the deployment's plan for zenvllm-e2e-0: no differences" in lines
    assert "VLLM_CPU_KVCACHE_SPACE=2 (the deployment's plan)" in lines
    assert not [ln for ln in lines if ln.startswith("plan:") or "plan said" in ln]  # no re-plan


def test_a_container_unlike_its_plan_says_how(capped, monkeypatch):
    lines = []
    monkeypatch.setattr(launcher, "log", lines.append)
    monkeypatch.setattr(launcher, "shm_free", lambda path="/dev/shm": 1 << 30)
    monkeypatch.setattr(launcher, "shm_total_mib", lambda path="/dev/shm": 512)
    env = {"LD_PRELOAD": "", "ZENVLLM_PLAN": promise_for(capped, cpus="2-3", target="zen")}
    launcher.prepare(["--model", "/m"], env, capped, {})
    warning = next(ln for ln in lines if ln.startswith("WARNING: this container differs"))
    assert "CPUs 0-1, planned 2-3" in warning and "/dev/shm 512 MiB, planned 1024 MiB" in warning
    assert "image target vllm-openai, planned zen" in warning


def test_a_malformed_plan_in_the_env_is_refused_with_the_fix(zen4):
    with pytest.raises(UserError, match=r"\$ZENVLLM_PLAN: not valid JSON.*unset it"):
        launcher.prepare(["--model", "/m"], {"ZENVLLM_PLAN": "not json"}, zen4, {})
