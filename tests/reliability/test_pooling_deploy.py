"""An embedding model deployed as an operator deploys one: deploy.yml on this machine
(the instances role, the nginx gateway with its keys and TLS, the verify role), with
sentence-transformers' all-MiniLM-L6-v2 from PyPI. The plan reads it as a pooling
model (no KV cache, vLLM's pooling runner), the verify role asks it through the gateway
for its pooling output instead of a completion, and clients get the instance's vectors
through the gateway: plain HTTPS and the OpenAI client library."""

from __future__ import annotations

import json
import math
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, require
from fleet import API_KEY, IMAGE, Fleet, deploy_then_remove, docker
from support.embedding_model import ensure_embedding_model
from test_fleet import ensure_image

pytestmark = pytest.mark.reliability

MODEL = "minilm"
TEXTS = ["The quick brown fox", "Paris is the capital of France"]
CLIENT = """
import json, sys, httpx
from openai import OpenAI
tls = httpx.Client(verify="/ca.pem")  # the gateway's own CA
client = OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], http_client=tls)
reply = client.embeddings.create(model=sys.argv[3], input=json.loads(sys.argv[4]))
print(json.dumps([d.embedding for d in reply.data]))
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
def pooled(tmp_path_factory):
    playbook = Path(sys.executable).parent / "ansible-playbook"
    require(playbook.exists(), f"{playbook} missing (make venv)")
    ensure_image()
    fleet = Fleet(
        root=tmp_path_factory.mktemp("pooled"),
        model_dir=ensure_embedding_model(),
        base_port=8331,
        gateway_port=8330,
        deployment="zenvllm-emb",
        extra={
            "zenvllm_instances_count": 1,
            "zenvllm_instances_kv_cache_gib": 0,  # the planner's: none, for a pooler
            "zenvllm_instances_max_model_len": 0,  # the model's own (256 tokens)
            "zenvllm_instances_served_model_name": MODEL,
        },
    )
    with deploy_then_remove(fleet, REPO / ".cache" / "reliability-pooled-deploy.log") as done:
        yield fleet, done.stdout


def test_the_plan_serves_it_as_a_pooler_and_the_deploy_checked_it_so(pooled):
    fleet, out = pooled
    (name,) = fleet.containers(1)
    command = json.loads(docker("inspect", name).stdout)[0]["Args"]
    assert "--runner=pooling" in command and f"--served-model-name={MODEL}" in command, command
    env = (fleet.config_dir / f"{name}.env").read_text()
    assert "VLLM_CPU_KVCACHE_SPACE=0\n" in env, env
    # The verify role asked for the pooling output, not a completion.
    assert f"{MODEL} pooled through the gateway: 384 values" in out, out[-4000:]
    assert "answered through the gateway" not in out  # the completion's check: skipped


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


def test_the_openai_client_embeds_through_the_gateway_over_tls(pooled):
    fleet, _ = pooled
    argv = ["run", "--rm", "--network", "host", "-v", f"{fleet.ca}:/ca.pem:ro"]
    argv += ["--entrypoint", "python", IMAGE, "-c", CLIENT, f"{fleet.gateway}/v1", API_KEY]
    done = docker(*argv, MODEL, json.dumps(TEXTS))
    vectors = json.loads(done.stdout.strip().splitlines()[-1])
    wanted = direct(fleet, {"model": MODEL, "input": TEXTS})["data"]
    for got, want in zip(vectors, wanted, strict=True):
        assert cosine(got, want["embedding"]) > 0.99999
