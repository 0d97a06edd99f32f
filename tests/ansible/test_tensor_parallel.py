"""A copy split with vLLM's tensor parallel, deployed by deploy.yml and served through the
gateway, on this machine's real engine.

This machine has one NUMA node; the planner on the host reads a faked view of it
(`zenvllm_instances_sysfs_root`: the same CPUs and memory, each core its own node, the
cgroup allowing memory node 0 only, as the real one does), and is asked for two ranks
(`zenvllm_instances_tensor_parallel: 2`). Everything after the plan is real: the
instances role runs the container the plan gives (`--tensor-parallel-size=2`, one
OpenMP list per rank), the launcher validates it against the plan, vLLM starts two
ranks, and nginx with its key and TLS answers a completion. `absent` removes it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import require
from fixtures.make_hosts import Cgroup, Topo, build
from support import engine, gateway
from support.ansible_run import planner_zipapp, playbook
from support.cpu import cpuinfo_flags, this_host
from support.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.ansible

IMAGE = "zenvllm/vllm-openai:0.32.0"
DEPLOYMENT = "zenvllm-tp"
GATEWAY = 18100
PORT = 18101
SITE = Path("/etc/nginx/conf.d/zenvllm-tp.conf")


def one_node_per_core(out: Path) -> Path:
    """This machine's CPUs as a sysfs/procfs tree in which each core is its own node."""
    host = this_host()
    cpus = sorted(host.allowed_cpus)
    topo = Topo(
        name="tp-view",
        description="this machine, each core its own NUMA node",
        model_name=host.model_name,
        flags=" ".join(sorted(cpuinfo_flags())),
        family=host.family or 0,
        model=host.cpu_model or 0,
        vendor=host.vendor,
        cores_per_socket=len(cpus),
        nodes_per_socket=len(cpus),
        node_mem_gib=host.mem_total_bytes / 2**30 / len(cpus),
        cgroup=Cgroup(2, "/", mems="0"),
    )
    build(topo, out)
    return out


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    require(engine.engine_ready(), "no container engine answers on DOCKER_HOST (make engine)")
    require(len(os.sched_getaffinity(0)) >= 2, "two ranks need two CPUs")
    if engine.docker("image", "inspect", IMAGE, check=False).returncode != 0:
        engine.build("vllm-openai", tmp_path_factory.mktemp("build") / "build.log")
    base = tmp_path_factory.mktemp("tp")
    variables = {
        "zenvllm_docker_host": engine.engine_env()["DOCKER_HOST"],
        "zenvllm_image": IMAGE,
        "zenvllm_image_source": "present",
        "zenvllm_model_dir": str(ensure_tiny_model()),
        "zenvllm_instances_deployment": DEPLOYMENT,
        "zenvllm_instances_sysfs_root": str(one_node_per_core(base / "view")),
        "zenvllm_instances_tensor_parallel": 2,
        "zenvllm_instances_kv_cache_gib": 1,
        "zenvllm_instances_max_model_len": 512,
        "zenvllm_instances_base_port": PORT,
        "zenvllm_instances_serve_args": ["--enforce-eager"],
        "zenvllm_instances_config_dir": str(base / "etc"),
        "zenvllm_instances_lib_dir": str(base / "lib"),
        "zenvllm_instances_seccomp_profile": str(base / "etc" / "seccomp-numa.json"),
        "zenvllm_instances_compile_cache_dir": str(base / "compile"),
        "zenvllm_planner": str(planner_zipapp(base)),
        "zenvllm_gateway_listen": f"127.0.0.1:{GATEWAY}",
        "zenvllm_gateway_site_path": str(SITE),
        "zenvllm_gateway_tls_dir": str(base / "tls"),
        "zenvllm_host_manage_sysctls": False,
        "zenvllm_host_manage_shm": False,
    }
    with gateway.nginx_as_found():
        yield variables
        if SITE.exists() or (base / "etc").exists():  # the test's own removal did not end it
            playbook(extra_vars={**variables, "zenvllm_state": "absent"})
        engine.docker("rm", "--force", f"{DEPLOYMENT}-0", check=False)
        SITE.unlink(missing_ok=True)


def test_a_split_copy_deploys_and_serves_through_the_gateway(deployment):
    start = time.monotonic()
    run = playbook(extra_vars=deployment)
    print(f"deploy with two ranks: {time.monotonic() - start:.0f} s")
    assert run.rc == 0 and run.failed() == 0, run.output[-6000:]

    name = f"{DEPLOYMENT}-0"
    found = json.loads(engine.docker("inspect", name).stdout)[0]
    assert "--tensor-parallel-size=2" in found["Args"], found["Args"]
    assert found["HostConfig"]["CpusetMems"] == "0"
    cpus = sorted(this_host().allowed_cpus)
    assert found["HostConfig"]["CpusetCpus"] == f"{cpus[0]}-{cpus[-1]}"
    env = Path(deployment["zenvllm_instances_config_dir"], f"{name}.env").read_text()
    assert "VLLM_CPU_OMP_THREADS_BIND=" + "|".join(map(str, cpus)) in env.splitlines()
    log = engine.logs(name)
    assert f"validated the deployment's plan for {name}: no differences" in log
    assert "Worker_TP0" in log and "Worker_TP1" in log, log[-4000:]

    body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 8, "ignore_eos": True}
    status, _, answer = gateway.request(
        f"https://127.0.0.1:{GATEWAY}/v1/completions", DEPLOYMENT, body
    )
    assert status == 200 and answer["usage"]["completion_tokens"] == 8, answer

    gone = playbook(extra_vars={**deployment, "zenvllm_state": "absent"})
    assert gone.rc == 0 and gone.failed() == 0, gone.output[-6000:]
    assert engine.docker("inspect", name, check=False).returncode != 0
    assert not SITE.exists()
