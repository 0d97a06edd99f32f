"""A served configuration's quality, asked of the server itself through vLLM's
OpenAI-compatible API: the logprobs it gives each token of held-out text (the prompt
echoed back, scored), made a perplexity by core/quality.py, and the greedy tokens it
makes after a fixed prompt, compared with its float32 reference's (bench/scored.py).

The text is given as token ids, the ones the reference was measured on, so the server
scores exactly those tokens and no tokenizer round trip can shift them: the model's own
held-out ids (heldout.json, where its maker left them), else heldout.txt, shipped with
the package, tokenized once by the server's own tokenizer (vLLM's /tokenize).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zenvllm.bench import http_client
from zenvllm.core import gate, quality

FIX = "is it a vLLM server of the model the text was made for?"
HELDOUT = "heldout.json"  # a model's own held-out token ids: a JSON list of lists of ids
MAX_IDS = 4096  # the most held-out ids scored: 16 chunks, seconds on a small model
VOCAB = 1 << 24  # no vocabulary has more ids


def prompt_logprobs(base_url: str, model: str, ids: Sequence[int]) -> list[float]:
    """The server's logprob of each token of `ids` after the first, given those before."""
    body = {
        "model": model,
        "prompt": list(ids),
        "max_tokens": 1,
        "echo": True,
        "logprobs": 0,
        "temperature": 0,
    }
    url = f"{base_url}/v1/completions"
    reply = gate.parse_json(gate.decode(http_client.post(url, body), url, FIX), url, FIX)
    choice = gate.obj(gate.items(gate.obj(reply, url, FIX).get("choices"), url, FIX)[0], url, FIX)
    scored = gate.items(gate.obj(choice.get("logprobs"), url, FIX).get("token_logprobs"), url, FIX)
    if len(scored) < len(ids):
        raise gate.InputError(f"{url}: {len(scored)} logprobs for {len(ids)} tokens; {FIX}")
    return [gate.number(lp, url, -1e9, 0, FIX) for lp in scored[1 : len(ids)]]


def served_perplexity(base_url: str, model: str, chunks: Sequence[Sequence[int]]) -> float:
    """The perplexity a server gives the held-out `chunks`, each scored on its own."""
    scored: list[float] = []
    for ids in chunks:
        scored += prompt_logprobs(base_url, model, ids)
    return quality.perplexity(scored)


def choice(reply: bytes, url: str) -> dict[str, Any]:
    """The first choice of a completions reply."""
    doc = gate.obj(gate.parse_json(gate.decode(reply, url, FIX), url, FIX), url, FIX)
    return gate.obj(gate.items(doc.get("choices"), url, FIX)[0], url, FIX)


def greedy(base_url: str, model: str, prompt: Sequence[int]) -> list[int]:
    """The GREEDY_TOKENS ids the server makes after `prompt` (temperature 0, its end of
    text ignored), as ids (vLLM's return_tokens_as_token_ids)."""
    body = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": quality.GREEDY_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    url = f"{base_url}/v1/completions"
    made = choice(http_client.post(url, body), url)
    tokens = gate.items(gate.obj(made.get("logprobs"), url, FIX).get("tokens"), url, FIX)
    try:
        return quality.token_ids([gate.text(t, url, FIX) for t in tokens])
    except ValueError as err:
        raise gate.InputError(f"{url}: {err}; {FIX}") from None


def tokenized(base_url: str, model: str, text: str) -> list[int]:
    """`text` as the server's tokenizer cuts it (vLLM's POST /tokenize)."""
    url = f"{base_url}/tokenize"
    reply = http_client.post(url, {"model": model, "prompt": text})
    doc = gate.obj(gate.parse_json(gate.decode(reply, url, FIX), url, FIX), url, FIX)
    ids = gate.items(doc.get("tokens"), url, FIX)
    return [gate.whole(i, url, 0, VOCAB, FIX) for i in ids]


def shipped_text() -> list[str]:
    """heldout.txt's paragraphs: plain prose written for this, in no model's training."""
    path = Path(__file__).with_name("heldout.txt")  # package data (pyproject.toml)
    text = gate.read_text(path, gate.SMALL, "reinstall zenvllm: its package data is missing")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def heldout(model_dir: Path, base_url: str, model: str) -> tuple[list[list[int]], str]:
    """The held-out segments of token ids and where they come from: the model's own
    heldout.json (bounded: gate.SMALL) if it has one, else heldout.txt's paragraphs
    tokenized by the server."""
    path = model_dir / HELDOUT
    fix = f"fix or remove {path}"
    found = gate.read_json(path, gate.SMALL, fix, optional=True)
    if found is not None:
        segments = gate.items(found, str(path), fix)
        ids = [gate.items(seg, str(path), fix) for seg in segments]
        return [[gate.whole(i, str(path), 0, VOCAB, fix) for i in seg] for seg in ids], HELDOUT
    return [tokenized(base_url, model, p) for p in shipped_text()], "heldout.txt"


def scored(base_url: str, model: str, model_dir: Path, max_model_len: int) -> dict[str, Any]:
    """One server's quality figures: the perplexity of the held-out chunks (at most
    MAX_IDS ids, chunks the served length allows), and its greedy tokens after the first
    chunk's first GREEDY_PROMPT ids."""
    segments, source = heldout(model_dir, base_url, model)
    chunks = quality.chunks(segments, max_model_len, MAX_IDS)
    if not chunks:
        raise gate.InputError(f"{source}: no held-out ids to score; {FIX}")
    return {
        "perplexity": served_perplexity(base_url, model, chunks),
        "scored_tokens": sum(len(c) - 1 for c in chunks),
        "text": source,
        "greedy": greedy(base_url, model, chunks[0][: quality.GREEDY_PROMPT]),
    }
