"""The bad-input catalogue (docs/reference/bad-input.md): one test per row.

Each row asserts what an operator needs from a refusal: a message naming the
value, the limit and the fix; a non-zero exit; and nothing half-done left
behind (no output on stdout, no partial files, no started containers).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, require, require_tool
from fleet import DOCKER_HOST, IMAGE, Fleet, docker
from support.cli import refused, zenvllm

pytestmark = pytest.mark.reliability


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def engine_up() -> None:
    require_tool("docker")
    up = docker("version", "--format", "{{.Server.Version}}", check=False).returncode == 0
    require(up, f"no container engine answers on {DOCKER_HOST} (make engine)")


def image_present(tag: str = IMAGE) -> None:
    engine_up()
    found = docker("image", "inspect", tag, check=False).returncode == 0
    require(found, f"image {tag} missing (make image)")


# -- the planner ---------------------------------------------------------------
def test_model_too_big_for_a_node():
    done = zenvllm("plan", "--flavor", "epyc-9454-24c-96g", "--model-size-gib", "140", "--json")
    refused(
        done,
        "does not fit this host",
        "144.5 GiB",  # what one instance needs: 140 weights + 2.5 runtime + 1 shm + 1 KV
        "node 0 has 93.1 GiB usable of 96.0 GiB",  # the limit
        "2 hosts of this kind would hold it",  # how far it is
        "plan across them with --hosts 2",  # the option that does
        "smaller or quantized model",  # the other fix
    )


def test_a_model_that_fits_an_avx2_host_only_in_bfloat16():
    # float32 (the planner's choice without AVX-512 BF16) doubles 16 GiB stored as bf16.
    done = zenvllm("plan", "--flavor", "epyc-7763-8c-32g", "--model-size-gib", "16")
    refused(
        done,
        "weights 32.0 GiB",  # float32's size
        "node 0 has 30.4 GiB usable of 32.0 GiB",  # the limit
        "plan across them with --hosts 2",  # one way out
        "--dtype bfloat16): it fits, 16.0 GiB of weights and KV 9 GiB",  # another, sized
        "4.4x slower than float32",  # and its cost
    )


def test_kv_cache_below_the_minimum():
    # An 8 GiB container: 4 GiB of weights plus runtime and shm leave no room for KV.
    root = FIXTURES / "container-cgroup1"
    done = zenvllm("plan", "--root", str(root), "--model-size-gib", "4", "--json")
    refused(
        done,
        "KV cache would be 0 GiB per instance",
        "below the 1 GiB minimum",
        "cgroup memory limit 8.0 GiB",
        "fewer instances, a smaller or quantized model, or a bigger flavor",
    )


def test_unknown_flavor():
    done = zenvllm("plan", "--flavor", "epyc-9999-1c-1g", "--model-size-gib", "1")
    refused(
        done,
        "unknown flavor 'epyc-9999-1c-1g'",
        "epyc-9454-24c-96g",  # the presets there are
        "vcpus=N,ram_gib=N",  # or how to describe one
    )


def test_target_needs_an_isa_this_cpu_lacks():
    # This machine has AVX-512 BF16 (Zen 4): a Zen 3 fixture without AVX-512 stands in.
    root = FIXTURES / "vm-milan-8vcpu-avx2"
    assert "avx512f" not in (root / "proc" / "cpuinfo").read_text()
    for target in ("zen", "pace"):
        done = zenvllm("plan", "--root", str(root), "--target", target, "--model-size-gib", "1")
        refused(
            done,
            f"target {target} needs avx512f, avx512_bf16",
            "AMD EPYC 7763",
            "Use --target vllm-openai",
        )


# -- images ----------------------------------------------------------------------
def test_pin_the_matrix_rules_out(tmp_path):
    output = tmp_path / "ctx"
    done = zenvllm(
        "render", "--target", "zen", "--pin", "zentorch=2.14.0.1", "--output", str(output)
    )
    refused(
        done,
        "zentorch 2.14.0.1 needs torch >=2.14.0,<2.15",  # the value and the limit
        "torch is pinned to 2.13.0+cpu",
        ">=2.13.0.0,<2.14",  # the supported range
        "--pin zentorch=",  # the fix
    )
    assert leftovers(tmp_path) == []  # no context, no temp dir beside it


# -- the deployment ----------------------------------------------------------------
@pytest.fixture
def fleet(tmp_path):
    from support.tiny_model import ensure_tiny_model

    playbook = Path(sys.executable).parent / "ansible-playbook"
    require(playbook.exists(), f"{playbook} missing (make venv)")
    engine_up()
    root = tmp_path / "fleet"
    return Fleet(root=root, model_dir=ensure_tiny_model(), base_port=8411, gateway_port=8410)


def test_malformed_yaml_vars_file(fleet, tmp_path):
    bad = tmp_path / "site.yml"
    bad.write_text(
        "zenvllm_instances_count: 2\n"
        "zenvllm_gateway_listen: [127.0.0.1:8410\n"  # the unclosed list
        "zenvllm_api_key: x\n"
    )
    done = fleet.playbook("-e", f"@{bad}")
    assert done.rc != 0
    out = done.output
    assert "YAML parsing failed" in out, out
    assert f"{bad}:3:" in out, out  # file and line
    assert "zenvllm_gateway_listen: [127.0.0.1:8410" in out  # the offending line, shown
    assert fleet.containers() == []
    assert not fleet.config_dir.exists()
    assert not fleet.site.exists()


def test_image_missing_on_the_host(fleet):
    missing = "zenvllm/vllm-openai:no-such-tag"
    assert docker("image", "inspect", missing, check=False).returncode != 0
    done = fleet.playbook(zenvllm_image=missing)
    out = done.output
    assert done.rc != 0, out
    assert f"Image {missing} is not on localhost" in out, out
    assert "make image" in out  # the fix
    # Refused before the instances role: no container, no env file, no gateway site.
    assert fleet.containers() == []
    assert not fleet.config_dir.exists()
    assert not fleet.site.exists()
    assert "TASK [zenvllm_instances" not in out


# -- the container ---------------------------------------------------------------------
def test_numa_syscalls_not_permitted_in_the_container():
    image_present()
    # The engine's default: no SYS_NICE, so get_mempolicy answers EPERM.
    done = docker(
        "run",
        "--rm",
        "--network",
        "host",
        "--entrypoint",
        "/opt/venv/bin/python",
        IMAGE,
        "-m",
        "zenvllm.runtime",
        "doctor",
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if "mempolicy" in x)
    assert line.startswith("fail"), line
    assert "get_mempolicy: Operation not permitted" in line
    assert "--cap-add SYS_NICE --security-opt seccomp=" in line  # the fix


def test_port_already_in_use(tmp_path):
    image_present()
    from support.tiny_model import ensure_tiny_model

    model = ensure_tiny_model()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        done = docker(
            "run", "--rm", "--network", "host", "--user", "10001:10001", "--shm-size", "1g",
            "--volume", f"{model}:/model:ro", IMAGE,
            "--model", "/model", "--host", "127.0.0.1", "--port", str(port), check=False,
        )  # fmt: skip
        seconds = time.monotonic() - start
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr, done.stderr[-3000:]
    assert "--port N" in done.stderr  # the fix
    assert "exec vllm" not in done.stderr  # refused before vLLM started
    assert seconds < 60, seconds  # not after loading a model


def test_omp_bind_outside_the_containers_cpus():
    image_present()
    from support.tiny_model import ensure_tiny_model

    model = ensure_tiny_model()
    done = docker(
        "run", "--rm", "--cpuset-cpus", "0", "--env", "VLLM_CPU_OMP_THREADS_BIND=0-3",
        "--volume", f"{model}:/model:ro", IMAGE, "--model", "/model", check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        "VLLM_CPU_OMP_THREADS_BIND=0-3 names CPU(s) 1-3 outside this container's CPUs 0"
        in done.stderr
    ), done.stderr[-3000:]
    assert "leave it unset for the planned binding" in done.stderr  # the fix
    assert "exec vllm" not in done.stderr  # refused before vLLM started


def test_build_failing_half_way(tmp_path):
    engine_up()
    tag = "zenvllm/reliability-broken:test"
    docker("rmi", tag, check=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    extra_ca = os.environ.get("ZENVLLM_EXTRA_CA_CERTS", "/usr/local/share/ca-certificates")
    ca = ["--extra-ca-certs", extra_ca] if Path(extra_ca).exists() else []
    # uv 0.13.99 passes the matrix (>=0.13.0,<0.14) but PyPI has no such release:
    # the build gets past its first stage and fails installing it (BuildKit: the runtime
    # stage's install fetches uv; the step is named by its command, not its mounts).
    done = zenvllm(
        "build", "--target", "vllm-openai", "--pin", "uv=0.13.99", "--tag", tag, *ca,
        "--log", str(tmp_path / "build.log"),
        env={"TMPDIR": str(tmp), "DOCKER_HOST": DOCKER_HOST},
    )  # fmt: skip
    refused(
        done,
        "the image build failed at step [runtime 2/",  # the step
        "RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir uv==0.13.99",
        "No matching distribution found for uv==0.13.99",  # the value
        "--pin NAME=VERSION",  # the fix
        "No image was tagged",
    )
    assert "[os " in (tmp_path / "build.log").read_text()  # it did get half-way
    assert docker("image", "inspect", tag, check=False).returncode != 0
    assert leftovers(tmp) == []  # no temp files
    # The render stays whole where every build of the target reads it (the next
    # build replaces it): no half-written or stale sibling beside it.
    contexts = Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm")) / "contexts"
    assert [p for p in leftovers(contexts) if p.startswith(".")] == []
    assert "uv==0.13.99" in (contexts / "vllm-openai" / "Dockerfile").read_text()


def test_build_interrupted_leaves_no_image_and_no_half_context(tmp_path):
    image_present()
    tag = "zenvllm/reliability-interrupted:test"
    docker("rmi", tag, check=False)
    contexts = Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm")) / "contexts"
    log = tmp_path / "build.log"
    extra_ca = os.environ.get("ZENVLLM_EXTRA_CA_CERTS", "/usr/local/share/ca-certificates")
    ca = ["--extra-ca-certs", extra_ca] if Path(extra_ca).exists() else []
    # --no-cache: every step runs again, so the build is under way when the signal lands.
    proc = subprocess.Popen(
        [sys.executable, "-m", "zenvllm", "build", "--target", "vllm-openai", "--no-cache",
         "--tag", tag, "--log", str(log), *ca],
        env={**os.environ, "DOCKER_HOST": DOCKER_HOST},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "[os " not in (
            log.read_text() if log.exists() else ""
        ):
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "zenvllm build: interrupted (SIGTERM); nothing half-written was left" in err
    assert docker("image", "inspect", tag, check=False).returncode != 0
    assert [p for p in leftovers(contexts) if p.startswith(".")] == []


def test_build_context_on_a_full_disk(tmp_path):
    image_present()
    require(os.geteuid() == 0, "mounting a small tmpfs needs root")
    cache = tmp_path / "cache"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(cache)], check=True)
    try:
        done = zenvllm(
            "build", "--target", "vllm-openai", "--tag", "zenvllm/reliability-full:test",
            env={"ZENVLLM_CACHE": str(cache), "DOCKER_HOST": DOCKER_HOST},
        )  # fmt: skip
        refused(done, "No space left on device", "free space there or choose another path")
        assert "Traceback" not in done.stderr
        # Only the lock zenvllm keeps for the target: no context, no staging directory.
        assert leftovers(cache / "contexts") == ["vllm-openai.lock"]
    finally:
        subprocess.run(["umount", str(cache)], check=True)
    assert docker("image", "inspect", "zenvllm/reliability-full:test", check=False).returncode
