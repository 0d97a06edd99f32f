"""Two models on one host behind one endpoint, deployed as an operator deploys them:
deploy.yml on this machine (the instances role, the nginx gateway with its keys and TLS,
the verify role) with `zenvllm_models`, each model delivered from the controller's copy:
sentence-transformers' all-MiniLM-L6-v2 from PyPI (an embedding model) and a tiny chat
model. The plan gives each its own cores and reads the encoder as a pooling model (no KV
cache, vLLM's pooling runner); the verify role asks each through the gateway as what it
is; the gateway sends each request to the model it names and lists both; one model's
instance dying leaves the other serving; and clients get the encoder's vectors through
the gateway: plain HTTPS and the OpenAI client.
"""

from __future__ import annotations

import json
import math
import os
import signal
import ssl
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, require
from fleet import API_KEY, IMAGE, Fleet, deploy_then_remove, docker
from support.embedding_model import ensure_embedding_model
from support.engine import wait_for
from support.tiny_model import ensure_tiny_model
from test_fleet import ensure_image

from zenvllm.core.topology import parse_cpu_list
from zenvllm.runtime.health import healthy

pytestmark = pytest.mark.reliability

MODEL, CHAT = "minilm", "tiny"  # the encoder first: its instance takes the base port
TEXTS = ["The quick brown fox", "Paris is the capital of France"]
CLIENT = """
import json, sys, httpx
from openai import OpenAI
tls = httpx.Client(verify="/ca.pem")  # the gateway's own CA
client = OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], http_client=tls)
reply = client.embeddings.create(model=sys.argv[3], input=json.loads(sys.argv[4]))
print(json.dumps({"models": sorted(m.id for m in client.models.list()),
                  "vectors": [d.embedding for d in reply.data]}))
"""


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def through_gateway(fleet: Fleet, path: str, body: dict, key: str | None = API_KEY) -> dict:
    headers = {"Content-Type": "application/json"}
    headers |= {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(
        f"{fleet.gateway}{path}", data=json.dumps(body).encode(), headers=headers
    )
    context = ssl.create_default_context(cafile=fleet.ca)
    with urllib.request.urlopen(request, timeout=60, context=context) as reply:
        return json.loads(reply.read())


def direct(fleet: Fleet, body: dict) -> dict:
    """The instance itself, on loopback (it wants the deployment's key too)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{fleet.base_port}/v1/embeddings",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Fleet:
    playbook = Path(sys.executable).parent / "ansible-playbook"
    require(playbook.exists(), f"{playbook} missing (make venv)")
    ensure_image()
    root = tmp_path_factory.mktemp("pooled")
    return Fleet(
        root=root,
        model_dir=ensure_embedding_model(),
        base_port=8331,
        gateway_port=8330,
        deployment="zenvllm-emb",
        extra={
            "zenvllm_model_dir": "",  # several models: each NAME=DIR in zenvllm_models
            "zenvllm_instances_served_model_name": "",
            # Each delivered by the role from the controller's copy, verified file by file.
            "zenvllm_models": [f"{MODEL}={root}/models/{MODEL}", f"{CHAT}={root}/models/{CHAT}"],
            "zenvllm_model_sources": {
                MODEL: str(ensure_embedding_model()),
                CHAT: str(ensure_tiny_model()),
            },
            "zenvllm_instances_count": 1,
            "zenvllm_instances_kv_cache_gib": 0,  # the planner's: none for the pooler
            "zenvllm_instances_max_model_len": 0,  # each model's own (the encoder's 256)
        },
    )


@pytest.fixture(scope="module")
def checked(fleet):
    """deploy.yml --check before the deploy, where neither model's directory is on the
    host yet: the planner plans from copies staged for the run. (The run's output, the
    test's own files afterwards.)"""
    done = fleet.playbook("--check")
    return done, sorted(p.name for p in fleet.root.iterdir())


@pytest.fixture(scope="module")
def pooled(fleet, checked):
    with deploy_then_remove(fleet, REPO / ".cache" / "reliability-pooled-deploy.log") as done:
        yield fleet, done.output


def test_check_mode_plans_both_models_on_a_host_without_them_and_changes_nothing(fleet, checked):
    done, left = checked
    assert done.rc == 0, done.output[-4000:]
    # The plan: an instance of each model (render.yml's loop names them, as it would write).
    for name in fleet.names(2):
        assert f"(item={name})" in done.output, done.output[-4000:]
    # The test's own (its variables, planner and Ansible's temp): no model, config or lib.
    assert left == ["ansible-remote-tmp", "vars.json", "zenvllm.pyz"]
    assert fleet.containers(2) == [] and not fleet.site.exists()


def cpuset(name: str) -> set[int]:
    return set(
        parse_cpu_list(json.loads(docker("inspect", name).stdout)[0]["HostConfig"]["CpusetCpus"])
    )


def test_each_model_gets_its_own_cores_and_the_deploy_asked_each_as_what_it_is(pooled):
    fleet, out = pooled
    # One deployment's instances, numbered on from one model to the next.
    encoder, chat = fleet.containers(2)
    assert (encoder, chat) == (f"{fleet.deployment}-0", f"{fleet.deployment}-1")
    command = json.loads(docker("inspect", encoder).stdout)[0]["Args"]
    assert "--runner=pooling" in command and f"--served-model-name={MODEL}" in command, command
    env = (fleet.config_dir / f"{encoder}.env").read_text()
    assert "VLLM_CPU_KVCACHE_SPACE=0\n" in env, env
    assert "VLLM_CPU_KVCACHE_SPACE=0\n" not in (fleet.config_dir / f"{chat}.env").read_text()
    cores = [cpuset(encoder), cpuset(chat)]
    assert cores[0] and cores[1] and cores[0].isdisjoint(cores[1]), cores
    for name in (MODEL, CHAT):  # each delivered to its own directory and verified
        assert (fleet.root / "models" / name / ".zenvllm-model").is_file(), name
    # The verify role asked each model as what it is, through the one gateway.
    assert f"{MODEL} pooled through the gateway: 384 values" in out, out[-4000:]
    assert f"{CHAT} answered through the gateway" in out, out[-4000:]


def test_the_gateway_sends_each_request_to_the_model_it_names(pooled):
    fleet, _ = pooled
    body = {"model": CHAT, "prompt": "Hello", "max_tokens": 5, "ignore_eos": True}
    assert through_gateway(fleet, "/v1/completions", body)["usage"]["completion_tokens"] == 5
    assert (
        len(through_gateway(fleet, "/v1/embeddings", {"model": MODEL, "input": "x"})["data"]) == 1
    )
    for wrong, status, says in ((dict(body, model="nope"), 404, "`nope` does not exist"),
                                ({"prompt": "Hello"}, 400, 'no "model"')):  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            through_gateway(fleet, "/v1/completions", wrong)
        answer = json.loads(refused.value.read())
        assert refused.value.code == status and says in answer["error"]["message"], answer
        assert f"models: {MODEL}, {CHAT}" in answer["error"]["message"]


def test_one_models_instance_dying_leaves_the_other_serving(pooled):
    """The chat model's instance is killed under a load of embeddings: not one embedding
    fails, and the chat model serves again once the engine restarted its instance."""
    fleet, _ = pooled
    chat, port = f"{fleet.deployment}-1", fleet.base_port + 1

    def embed(i: int) -> int:
        return len(
            through_gateway(fleet, "/v1/embeddings", {"model": MODEL, "input": f"{i}"})["data"]
        )

    pid = json.loads(docker("inspect", chat).stdout)[0]["State"]["Pid"]
    with ThreadPoolExecutor(4) as pool:
        pending = [pool.submit(embed, i) for i in range(120)]
        os.kill(pid, signal.SIGKILL)  # a real crash of the chat model's instance
        wait_for(lambda: not healthy(port), 60, f"{chat} down")
        with pytest.raises(urllib.error.HTTPError):  # nothing else serves the chat model
            through_gateway(
                fleet, "/v1/completions", {"model": CHAT, "prompt": "Hi", "max_tokens": 2}
            )
        assert [f.result() for f in pending] == [1] * 120
    wait_for(lambda: healthy(port), 600, f"/health of {chat}", every=1)
    body = {"model": CHAT, "prompt": "Hello", "max_tokens": 3, "ignore_eos": True}
    assert through_gateway(fleet, "/v1/completions", body)["usage"]["completion_tokens"] == 3


def test_embeddings_through_the_gateway_are_the_instances_and_need_a_key(pooled):
    fleet, _ = pooled
    body = {"model": MODEL, "input": TEXTS}
    gated = through_gateway(fleet, "/v1/embeddings", body)
    pairs = zip(gated["data"], direct(fleet, body)["data"], strict=True)
    assert all(cosine(g["embedding"], d["embedding"]) > 0.99999 for g, d in pairs)
    assert len(gated["data"][0]["embedding"]) == 384
    with pytest.raises(urllib.error.HTTPError) as refused:
        through_gateway(fleet, "/v1/embeddings", body, key=None)
    assert refused.value.code == 401


def test_score_and_rerank_go_through_the_gateway_by_model(pooled):
    """/score and /rerank, routed by their body's model like every path: for an
    embedding model vLLM scores a pair by the cosine of its two vectors."""
    fleet, _ = pooled
    query, documents = "What is the capital of France?", TEXTS
    embedded = direct(fleet, {"model": MODEL, "input": [query, *documents]})["data"]
    vectors = [d["embedding"] for d in sorted(embedded, key=lambda d: d["index"])]
    want = [cosine(vectors[0], v) for v in vectors[1:]]
    body = {"model": MODEL, "queries": query, "documents": documents}
    scored = through_gateway(fleet, "/score", body)["data"]
    got = [d["score"] for d in sorted(scored, key=lambda d: d["index"])]
    print(f"scores through the gateway {got}, the vectors' cosines {want}")
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-3
    body = {"model": MODEL, "query": query, "documents": documents}
    ranked = through_gateway(fleet, "/rerank", body)["results"]
    assert [r["index"] for r in ranked] == sorted(range(len(documents)), key=lambda i: -want[i])


def test_the_openai_client_lists_both_and_embeds_through_the_gateway_over_tls(pooled):
    fleet, _ = pooled
    argv = ["run", "--rm", "--network", "host", "-v", f"{fleet.ca}:/ca.pem:ro"]
    argv += ["--entrypoint", "python", IMAGE, "-c", CLIENT, f"{fleet.gateway}/v1", API_KEY]
    done = docker(*argv, MODEL, json.dumps(TEXTS))
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert reply["models"] == sorted([MODEL, CHAT])
    wanted = direct(fleet, {"model": MODEL, "input": TEXTS})["data"]
    for got, want in zip(reply["vectors"], wanted, strict=True):
        assert cosine(got, want["embedding"]) > 0.99999
