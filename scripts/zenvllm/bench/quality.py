"""A served configuration's quality, asked of the server itself through vLLM's
OpenAI-compatible API: the logprobs it gives each token of held-out text (the prompt
echoed back, scored), made a perplexity by core/quality.py.

The text is given as token ids, the ones the reference was measured on, so the server
scores exactly those tokens and no tokenizer round trip can shift them.
"""

from __future__ import annotations

from collections.abc import Sequence

from zenvllm.bench import http_client
from zenvllm.core import gate, quality

FIX = "is it a vLLM server of the model the text was made for?"


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
