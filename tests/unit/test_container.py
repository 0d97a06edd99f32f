"""The container contract: one planned instance plus a deployment's request give the
complete `docker run`, and its hash moves with everything that shapes the container."""

from __future__ import annotations

import dataclasses

import pytest

from zenvllm.core import request
from zenvllm.core.container import container_of, secrets_digest
from zenvllm.core.errors import UserError
from zenvllm.core.flavors import synthetic_host
from zenvllm.core.model import model_of_size
from zenvllm.core.plan import Policy, make_plan
from zenvllm.core.request import Request


@pytest.fixture(scope="module")
def instance():
    host = synthetic_host("epyc-9454-24c-96g")
    return make_plan(host, model_of_size(4), Policy(name_prefix="site-a")).instances[0]


SETTINGS = Request(
    deployment="site-a",
    supervisor="systemd",
    image="zenvllm/zen:0.32.0",
    image_id="sha256:abc",
    model_dir="/srv/models/Qwen2.5-1.5B",
    seccomp_profile="/etc/zenvllm/seccomp-numa.json",
    max_model_len=4096,
)


def test_the_spec_holds_placement_security_mounts_labels_and_command(instance):
    c = container_of(instance, SETTINGS)
    assert c.name == "site-a-0" and c.port == instance.port
    assert c.served_model_name == "Qwen2.5-1.5B"
    for option in (
        f"--cpuset-cpus={instance.to_dict()['docker_args'][0].split('=')[1]}",
        f"--memory={instance.memory_limit_mib}m",
        f"--shm-size={instance.shm_size_mib}m",
        "--cap-drop=ALL",
        "--cap-add=SYS_NICE",
        "--security-opt=seccomp=/etc/zenvllm/seccomp-numa.json",
        "--user=10001:10001",
        "--env-file=/etc/zenvllm/site-a-0.env",
        "--volume=/srv/models/Qwen2.5-1.5B:/model:ro",
        "--label=zenvllm.deployment=site-a",
        f"--label=zenvllm.config={c.config_hash}",
    ):
        assert option in c.options, option
    assert c.command[:4] == (
        "--model=/model",
        "--served-model-name=Qwen2.5-1.5B",
        "--host=127.0.0.1",
        f"--port={instance.port}",
    )
    assert "--max-model-len=4096" in c.command
    assert c.env["VLLM_CPU_KVCACHE_SPACE"] == str(instance.kv_cache_gib)
    assert c.env["HF_HUB_OFFLINE"] == "1" and "VLLM_API_KEY" not in c.env


def test_systemd_runs_it_in_the_foreground_the_engine_restarts_it(instance):
    assert container_of(instance, SETTINGS).run_args[:2] == ["run", "--rm"]
    engine = container_of(instance, dataclasses.replace(SETTINGS, supervisor="engine"))
    assert engine.run_args[:3] == ["run", "--detach", "--restart=unless-stopped"]
    assert engine.run_args[-len(engine.command) - 1] == SETTINGS.image


@pytest.mark.parametrize(
    "change",
    [
        {"image_id": "sha256:def"},
        {"model_dir": "/srv/models/other"},
        {"serve_args": ("--enforce-eager",)},
        {"extra_env": {"VLLM_LOGGING_LEVEL": "DEBUG"}},
        {"address": "10.0.0.5"},
    ],
)
def test_the_hash_moves_with_what_shapes_the_container(instance, change):
    before = container_of(instance, SETTINGS).config_hash
    assert container_of(instance, dataclasses.replace(SETTINGS, **change)).config_hash != before


def test_a_new_secret_moves_the_hash_without_entering_the_spec(instance):
    key = "sk-test-secret-value"
    with_key = secrets_digest({"VLLM_API_KEY": key})
    c = container_of(instance, SETTINGS, with_key)
    assert c.config_hash != container_of(instance, SETTINGS).config_hash
    assert key not in repr(c.to_dict()) and key not in with_key
    assert secrets_digest({"VLLM_API_KEY": ""}) == ""  # empty: no secret


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"imgae": "x"}', "'imgae' is not an option of a request"),
        ("[1]", "not a JSON object"),
        ('{"supervisor": "cron"}', 'supervisor is "cron", not one of auto, systemd, engine'),
        ('{"api_key": "x"}', "'api_key' is not an option of a request"),
        ("{", "Expecting"),
        ('{"address": "llm-a.internal"}', "address 'llm-a.internal' is not an IP address"),
    ],
)
def test_bad_requests_are_refused_by_name(text, says):
    with pytest.raises(UserError, match="--request") as refused:
        request.from_json(text)
    assert says in str(refused.value)


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:{port}"),
        ("10.0.0.5", "http://10.0.0.5:{port}"),
        ("fd00::5", "http://[fd00::5]:{port}"),
    ],
)
def test_behind_a_router_it_listens_on_the_private_address_the_plan_names(instance, address, url):
    asked = request.from_json(f'{{"address": "{address}", "supervisor": "engine"}}')
    c = container_of(instance, asked)
    assert f"--host={address}" in c.command
    assert c.url == url.format(port=instance.port) == c.to_dict()["url"]


def test_the_container_names_every_file_a_deployment_writes_for_it(instance):
    settings = Request(config_dir="/srv/z", unit_dir="/run/systemd/system", supervisor="engine")
    container = container_of(instance, settings)
    assert container.files == [
        "/srv/z/site-a-0.env",
        "/srv/z/site-a-0.run.sh",
        "/run/systemd/system/site-a-0.service",
    ]
    assert container.unit == "site-a-0.service"
    assert f"--env-file={container.env_file}" in container.options
    assert container.to_dict()["files"] == container.files
