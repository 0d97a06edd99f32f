"""A real embedding model served the way a user runs it: `docker run IMAGE --model
/model` with sentence-transformers' all-MiniLM-L6-v2 (from PyPI: support/embedding_model).
The launcher reads it as a pooling model and asks vLLM for the pooling runner with no
KV cache; /v1/embeddings must give the vectors the reference implementation gives
(transformers' BertModel in float32, mean-pooled over the attention mask and normalised,
as the model's sentence-transformers modules say), and the OpenAI client's
`embeddings.create` must work against it. A cross-encoder (support/reranker_model: that
model's BERT under a one-label classification head) is served the same way, and its
/score and /rerank must give transformers' BertForSequenceClassification's scores."""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require
from support import cpu, engine
from support.embedding_model import ensure_embedding_model
from support.reranker_model import ensure_reranker_model

from zenvllm.runtime.health import healthy

pytestmark = pytest.mark.serve

TEXTS = ["The quick brown fox", "A vLLM server on an EPYC CPU", "Paris is the capital of France"]
DIMENSIONS = 384
# The reference: what sentence-transformers computes for this model (modules.json:
# Transformer, mean Pooling, Normalize), in float32 on the CPU, in the image's torch.
REFERENCE = """
import json, sys, torch
from transformers import AutoModel, AutoTokenizer
texts = json.loads(sys.argv[1])
tok = AutoTokenizer.from_pretrained("/model")
model = AutoModel.from_pretrained("/model", torch_dtype=torch.float32).eval()
batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
with torch.no_grad():
    hidden = model(**batch).last_hidden_state
mask = batch["attention_mask"].unsqueeze(-1).float()
pooled = (hidden * mask).sum(1) / mask.sum(1)
print(json.dumps(torch.nn.functional.normalize(pooled, dim=-1).tolist()))
"""
QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France", "The quick brown fox", "A vLLM server on a CPU"]
# The cross-encoder's reference: transformers' BertForSequenceClassification in float32,
# each pair tokenised as the model's tokenizer pairs them ([CLS] query [SEP] document
# [SEP], token types 0 then 1); one label, so a score is the logit's sigmoid
# (sentence-transformers' CrossEncoder default for one label).
SCORES = """
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
query, documents = json.loads(sys.argv[1])
tok = AutoTokenizer.from_pretrained("/model")
model = AutoModelForSequenceClassification.from_pretrained("/model", torch_dtype=torch.float32)
batch = tok([query] * len(documents), documents, padding=True, return_tensors="pt")
with torch.no_grad():
    logits = model.eval()(**batch).logits[:, 0]
print(json.dumps(torch.sigmoid(logits).tolist()))
"""
# The OpenAI client library (a vLLM dependency, in the image) against the server.
CLIENT = """
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="none")
reply = client.embeddings.create(model="/model", input=json.loads(sys.argv[2]))
vectors = [d.embedding for d in reply.data]
print(json.dumps({"vectors": vectors, "tokens": reply.usage.prompt_tokens}))
"""


def in_image(
    image: str, code: str, *args: str, network: str = "none", model: Path | None = None
) -> str:
    """Python in a throwaway container of the image, the model mounted; its stdout."""
    model = model or ensure_embedding_model()
    argv = ["run", "--rm", "--network", network, "-v", f"{model}:/model:ro"]
    done = engine.docker(*argv, "--entrypoint", "python", image, "-c", code, *args)
    return done.stdout.strip().splitlines()[-1]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@contextlib.contextmanager
def pooling_server(model: Path, what: str, logs: Path) -> Iterator[tuple[str, str, int]]:
    """`docker run IMAGE --model /model` of a pooling model, healthy: (image, name, port).
    No --max-model-len (engine.serve gives 512): vLLM takes the model's own limit (256
    tokens for all-MiniLM-L6-v2, sentence_bert_config.json's max_seq_length) and refuses
    a longer one. Eager: the serve tier's other tests prove the compiled path; these the
    pooler."""
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")
    image, _ = engine.build("vllm-openai", logs / "build.log")
    port, start = engine.free_port(), time.monotonic()
    args = ("--model", "/model", "--port", str(port), "--enforce-eager")
    with engine.container(image, *args, run_opts=("-v", f"{model}:/model:ro")) as name:
        engine.wait_for(lambda: healthy(port), 420, "/health", name, every=2)
        print(f"{what} ready in {time.monotonic() - start:.0f} s")
        yield image, name, port


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    with pooling_server(ensure_embedding_model(), "embedding server", logs) as served:
        yield served


def test_the_launcher_serves_an_encoder_as_a_pooler_without_a_kv_cache(embedder):
    _, name, _ = embedder
    log = engine.logs(name)
    assert "zenvllm-launch: runner pooling: BertModel with a sentence-transformers" in log, log
    assert "zenvllm-launch: VLLM_CPU_KVCACHE_SPACE=0 (planned)" in log, log
    assert re.search(r"zenvllm-launch: exec vllm serve /model .*--runner=pooling", log), log
    assert f"dtype=torch.{cpu.serving_dtype()}" in log, log  # this CPU's native dtype
    # vLLM's own view of what it serves (a set: its order changes from run to run).
    assert re.search(r"Supported tasks: \[[^]]*'embed'", log), log


def test_the_vectors_are_the_reference_implementations(embedder):
    image, _, port = embedder
    reply = engine.http_json(
        f"http://127.0.0.1:{port}/v1/embeddings", {"model": "/model", "input": TEXTS}
    )
    served = [d["embedding"] for d in sorted(reply["data"], key=lambda d: d["index"])]
    reference = json.loads(in_image(image, REFERENCE, json.dumps(TEXTS)))
    assert [len(v) for v in served] == [DIMENSIONS] * len(TEXTS)
    similar = [cosine(a, b) for a, b in zip(served, reference, strict=True)]
    print(f"cosine to the float32 reference: {similar}")
    # bfloat16 (or float32) against float32: measured 0.99995 with bfloat16 on a Zen 4.
    assert min(similar) > 0.999, similar
    # Different texts stay apart: a server returning one vector for all would fail here.
    assert cosine(served[0], served[2]) < 0.9


def test_the_openai_client_gets_the_same_vectors(embedder):
    image, _, port = embedder
    url = f"http://127.0.0.1:{port}/v1"
    got = json.loads(in_image(image, CLIENT, url, json.dumps(TEXTS), network="host"))
    direct = engine.http_json(
        f"http://127.0.0.1:{port}/v1/embeddings", {"model": "/model", "input": TEXTS}
    )
    assert got["tokens"] == direct["usage"]["prompt_tokens"] > len(TEXTS)
    for a, d in zip(got["vectors"], sorted(direct["data"], key=lambda d: d["index"]), strict=True):
        assert cosine(a, d["embedding"]) > 0.99999


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    model, logs = ensure_reranker_model(), tmp_path_factory.mktemp("logs")
    with pooling_server(model, "reranker", logs) as (image, name, port):
        yield image, name, port, model


def test_the_launcher_serves_a_cross_encoder_for_scores(reranker):
    _, name, _, _ = reranker
    log = engine.logs(name)
    said = "runner pooling: BertForSequenceClassification: a classification head, served for"
    assert f"zenvllm-launch: {said} scores (/score, /rerank)" in log, log
    assert "zenvllm-launch: VLLM_CPU_KVCACHE_SPACE=0 (planned)" in log, log
    assert re.search(r"zenvllm-launch: exec vllm serve /model .*--runner=pooling", log), log
    assert re.search(r"Supported tasks: \[[^]]*'classify'", log), log  # /score, /rerank


def test_scores_and_ranks_are_the_reference_implementations(reranker):
    image, _, port, model = reranker
    reference = json.loads(in_image(image, SCORES, json.dumps([QUERY, DOCUMENTS]), model=model))
    url = f"http://127.0.0.1:{port}"
    reply = engine.http_json(f"{url}/score", {"queries": QUERY, "documents": DOCUMENTS})
    scores = [d["score"] for d in sorted(reply["data"], key=lambda d: d["index"])]
    print(f"scores {scores}, the float32 reference's {reference}")
    assert len(scores) == len(DOCUMENTS)
    # bfloat16 (or float32) against float32.
    assert max(abs(a - b) for a, b in zip(scores, reference, strict=True)) < 0.02
    assert max(reference) - min(reference) > 0.1  # a server scoring all alike fails here
    ranked = engine.http_json(f"{url}/rerank", {"query": QUERY, "documents": DOCUMENTS})
    results = ranked["results"]
    assert [r["index"] for r in results] == sorted(range(len(DOCUMENTS)), key=lambda i: -scores[i])
    for r in results:
        assert r["document"]["text"] == DOCUMENTS[r["index"]]
        assert abs(r["relevance_score"] - scores[r["index"]]) < 1e-6
