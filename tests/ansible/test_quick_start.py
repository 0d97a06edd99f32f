"""README's quick start 2, run as written against a fresh remote host: a systemd-nspawn
machine booted from the Debian root the other modules use, reached over ssh on a bridge
of its own, with nothing of zenvllm on it, no engine and no image. The operator has the
collection installed (ansible-galaxy, offline, into an empty collections path, no
ansible.cfg of the checkout's), the image built on the controller, the model on the host
at the path README names, and an inventory.yml of theirs in the directory they type the
command in. The inventory holds what an nspawn machine cannot take (sysctls outside
net.*), what this 24 GiB machine shared with other tests can give (a 1 GiB KV cache,
eager mode: no compile), and the controller's image archives: the one the tests saved.

The play must install the engine, ship the image from the controller (the image role's
default source), plan and start real vLLM, put nginx with TLS and a key in front, and
end with its own completion; then a client's completion through the gateway, checked
against the certificate the play made, valid for the host's inventory address from this
first run."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
import yaml
from conftest import require, require_tool
from support import engine, gateway, nspawn, readme
from support.ansible_run import env, install_collection
from support.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.ansible

IMAGE = "zenvllm/vllm-openai:0.32.0"
HOST = "qs-a"
MODEL = "srv/models/Qwen2.5-1.5B-Instruct"  # README's, under the host's root
SSH_ARGS = " ".join(nspawn.SSH_OPTIONS)


@pytest.fixture(scope="module")
def operator(tmp_path_factory):
    require(os.geteuid() == 0, "nspawn hosts need root")
    require_tool("systemd-nspawn")
    require(engine.engine_ready(), "no container engine answers on DOCKER_HOST (make engine)")
    work = tmp_path_factory.mktemp("quick-start")
    if engine.docker("image", "inspect", IMAGE, check=False).returncode != 0:
        engine.build("vllm-openai", work / "build.log")
    archives = engine.image_archive(IMAGE).parent  # saved once for every test host
    collections = install_collection(work)
    with nspawn.fleet([HOST], work, nspawn.QUICK_START) as (machine,):
        shutil.copytree(ensure_tiny_model(), machine.root / MODEL)  # the operator's copy
        site = work / "operator"
        site.mkdir()
        host = {
            "ansible_host": machine.address,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(machine.key),
            "ansible_ssh_common_args": SSH_ARGS,
            "zenvllm_host_sysctls": {"net.core.somaxconn": 4096},
            "zenvllm_instances_kv_cache_gib": 1,
            "zenvllm_instances_serve_args": ["--enforce-eager"],  # no compile: a minute less
            "zenvllm_image_controller_dir": str(archives),
        }
        inventory = {"zenvllm": {"hosts": {HOST: host}}}
        (site / "inventory.yml").write_text(yaml.safe_dump(inventory))
        theirs = {k: v for k, v in env().items() if not k.startswith("ANSIBLE_")}
        theirs |= {
            "ANSIBLE_COLLECTIONS_PATH": str(collections),
            "ANSIBLE_HOME": str(work / "ansible-home"),
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "DOCKER_HOST": engine.engine_env()["DOCKER_HOST"],
        }
        yield machine, site, theirs


def test_quick_start_2_serves_a_fresh_remote_host_as_written(operator):
    machine, site, theirs = operator
    start = time.monotonic()
    done = readme.run("quick-start-2", cwd=site, env=theirs, timeout=1800)
    print(f"quick start 2 on a fresh host: {time.monotonic() - start:.0f} s")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Qwen2.5-1.5B-Instruct answered through the gateway" in done.stdout
    assert "TASK [zenvllm.cpu.zenvllm_image : Send the image archive to the host" in done.stdout
    url = f"https://{machine.address}/v1/completions"
    body = {"model": "Qwen2.5-1.5B-Instruct", "prompt": "Hello", "max_tokens": 8}
    status, _, answer = gateway.request(url, "zenvllm", body | {"ignore_eos": True}, host=HOST)
    assert status == 200 and answer["usage"]["completion_tokens"] == 8, answer
    loaded = subprocess.run(
        nspawn.ssh_argv(machine, f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert loaded.stdout.strip() == engine.image_id(IMAGE), loaded.stderr


def test_the_status_playbook_runs_as_written_on_the_deployed_host(operator):
    """docs/how-to/operations.md's status playbook, from the collection, on the host quick
    start 2 deployed: a row for its instance, healthy; the run fails naming the drift an
    nspawn host's engine makes (it keeps no cpuset), and nothing else."""
    _, site, theirs = operator
    done = readme.run("status-playbook", cwd=site, env=theirs, timeout=600)
    output = done.stdout + done.stderr
    rows = [
        cells
        for line in output.splitlines()
        if len(cells := line.strip().removeprefix("- ").strip("'\",").split()) == 11
        and cells[0] == HOST
    ]
    assert rows, output[-4000:]
    for row in rows:  # name, health
        assert row[1].startswith("zenvllm-") and row[6] == "ok", rows
    if done.returncode != 0:  # placement: drifted where the engine kept no cpuset
        assert {row[5] for row in rows} == {"drifted"}, rows
        assert "cpuset unrestricted is not the planned" in output, output[-4000:]
