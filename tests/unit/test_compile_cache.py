"""vLLM's compile cache per instance: keyed by what shapes the compiled code, mounted by
the container contract, and the launcher saying whether a start is warm."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from zenvllm.core import compile_cache, request
from zenvllm.core.container import container_of, secrets_digest
from zenvllm.core.errors import UserError
from zenvllm.core.flavors import synthetic_host
from zenvllm.core.model import model_of_size
from zenvllm.core.plan import Policy, make_plan
from zenvllm.core.request import Request
from zenvllm.runtime import warm_start

ROOT = "/var/cache/zenvllm/compile"
SETTINGS = Request(
    deployment="site-a",
    supervisor="systemd",
    image="zenvllm/zen:0.32.0",
    image_id="sha256:abc",
    model_dir="/srv/models/Qwen2.5-1.5B",
    compile_cache_dir=ROOT,
)


@pytest.fixture(scope="module")
def plan():
    host = synthetic_host("epyc-9454-24c-96g")
    return make_plan(host, model_of_size(4), Policy(name_prefix="site-a", instances=2))


def cache_of(instance, **changes) -> str:
    return container_of(instance, dataclasses.replace(SETTINGS, **changes)).cache_dir


def test_each_instance_mounts_its_own_directory(plan):
    first, second = (container_of(i, SETTINGS) for i in plan.instances[:2])
    assert first.cache_dir.startswith(f"{ROOT}/site-a-0/")
    assert second.cache_dir.startswith(f"{ROOT}/site-a-1/")
    assert f"--volume={first.cache_dir}:/var/cache/vllm" in first.options
    assert len(first.cache_dir.rsplit("/", 1)[1]) == 16


@pytest.mark.parametrize(
    "change",
    [
        {"image_id": "sha256:def"},
        {"image": "zenvllm/vllm-openai:0.32.0"},
        {"serve_args": ("--enforce-eager",)},
        {"max_model_len": 2048},
        {"model_dir": "/srv/models/other"},
        {"extra_env": {"VLLM_ZENTORCH_WEIGHT_PREPACK": "0"}},
    ],
)
def test_a_change_that_shapes_the_compiled_code_moves_the_key(plan, change):
    assert cache_of(plan.instances[0], **change) != cache_of(plan.instances[0])


def test_instances_of_one_shape_share_the_key_each_in_its_own_directory(plan):
    """Their ports, cores, memory nodes and names differ; their compiled code does not
    (docs/test-runs/2026-11-27-zen4-compile-cache-across-placements.txt)."""
    first, second = (container_of(i, SETTINGS) for i in plan.instances[:2])
    assert first.port != second.port and first.env != second.env
    assert first.options != second.options  # their --cpuset-cpus and names
    assert first.cache_dir.rsplit("/", 1)[1] == second.cache_dir.rsplit("/", 1)[1]
    assert first.cache_dir != second.cache_dir


def test_other_cpus_keep_the_key(plan):
    instance = plan.instances[0]
    moved = dataclasses.replace(instance, cpus=frozenset(sorted(instance.cpus)[1:]))
    assert cache_of(moved) == cache_of(instance)


def test_a_new_api_key_keeps_the_cache(plan):
    """Secrets restart the instance (config hash) but compile nothing different."""
    instance = plan.instances[0]
    plain = container_of(instance, SETTINGS)
    keyed = container_of(instance, SETTINGS, secrets_digest({"VLLM_API_KEY": "k"}))
    assert keyed.config_hash != plain.config_hash
    assert keyed.cache_dir == plain.cache_dir


def test_no_root_no_mount(plan):
    c = container_of(plan.instances[0], dataclasses.replace(SETTINGS, compile_cache_dir=""))
    assert c.cache_dir == "" and not any("/var/cache/vllm" in o for o in c.options)


@pytest.mark.parametrize("bad", ["relative/dir", "/a:b", "/a,b"])
def test_a_root_docker_cannot_mount_is_refused(bad):
    with pytest.raises(UserError, match="compile_cache_dir"):
        request.from_json(json.dumps({"compile_cache_dir": bad}))


def test_the_env_turns_vllms_broken_cpu_aot_load_off_and_points_inductor_inside():
    env = compile_cache.env("/c")
    assert env == {
        "VLLM_CACHE_ROOT": "/c",
        "TORCHINDUCTOR_CACHE_DIR": "/c/inductor",
        "VLLM_USE_AOT_COMPILE": "0",
    }


def test_mount_points_are_read_from_mountinfo():
    mountinfo = (
        "22 1 0:21 / / rw - overlay overlay rw\n"
        "30 22 8:1 /var/cache/zenvllm/compile/a/k /var/cache/vllm rw - ext4 /dev/vda rw\n"
        "31 22 8:1 /x /with\\040space rw - ext4 /dev/vda rw\n"
    )
    assert warm_start.mount_points(mountinfo) == {"/", "/var/cache/vllm", "/with space"}


def test_the_launcher_says_cold_then_warm_and_keeps_explicit_env(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir()
    info = tmp_path / "mountinfo"
    info.write_text(f"30 22 8:1 /k {root} rw - ext4 /dev/vda rw\n")
    monkeypatch.setattr(warm_start, "MOUNTINFO", info)
    env = {"VLLM_CACHE_ROOT": str(root), "VLLM_USE_AOT_COMPILE": "1", "TMPDIR": str(tmp_path)}
    assert "cold" in warm_start.use_compile_cache(env)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{root}/inductor"
    assert env["VLLM_USE_AOT_COMPILE"] == "1"  # the operator's choice stays
    (root / "inductor" / "ab").mkdir(parents=True)
    (root / "inductor" / "ab" / "k.so").write_bytes(b"x" * 2_000_000)
    line = warm_start.use_compile_cache(dict(env))
    assert "warm (1 compiled artifacts, 2.0 MB" in line


def test_the_launcher_says_a_cache_outside_a_volume_is_not_kept(tmp_path, monkeypatch):
    info = tmp_path / "mountinfo"
    info.write_text("22 1 0:21 / / rw - overlay overlay rw\n")
    monkeypatch.setattr(warm_start, "MOUNTINFO", info)
    env = {"VLLM_CACHE_ROOT": str(tmp_path), "TMPDIR": str(tmp_path / "tmp")}
    assert "not kept" in warm_start.use_compile_cache(env)
    assert env["VLLM_USE_AOT_COMPILE"] == "0"


def test_an_unwritable_root_leaves_vllms_defaults(tmp_path):
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "absent")}
    assert "not kept" in warm_start.use_compile_cache(env)
    assert "TORCHINDUCTOR_CACHE_DIR" not in env


def test_inductors_default_directory_links_into_the_kept_cache(tmp_path, monkeypatch):
    """torch 2.13 builds its precompiled headers under default_cache_dir() whatever
    TORCHINDUCTOR_CACHE_DIR says: the launcher links that directory into the cache (once;
    a directory already there is left as it is)."""
    root = tmp_path / "cache"
    root.mkdir()
    info = tmp_path / "mountinfo"
    info.write_text(f"30 22 8:1 /k {root} rw - ext4 /dev/vda rw\n")
    monkeypatch.setattr(warm_start, "MOUNTINFO", info)
    env = {"VLLM_CACHE_ROOT": str(root), "TMPDIR": str(tmp_path), "USER": "vl/lm"}
    warm_start.use_compile_cache(env)
    link = tmp_path / "torchinductor_vl_lm"  # torch's sanitising of the name
    assert link.is_symlink() and link.resolve() == root / "inductor"
    warm_start.use_compile_cache(dict(env))  # a restart: the link stays
    assert link.resolve() == root / "inductor"
    theirs = tmp_path / "other"
    (theirs / "torchinductor_x").mkdir(parents=True)
    warm_start.use_compile_cache({**env, "TMPDIR": str(theirs), "USER": "x"})
    assert not (theirs / "torchinductor_x").is_symlink()
    assert warm_start.inductor_default_dir({}, 0) == Path("/tmp/torchinductor_root")
