"""Speculative decoding on this CPU, measured (issue 65): the trained model served alone,
with n-gram (prompt lookup) and with its draft model, each at batch 1 on a prompt whose
continuation copies from it and on one whose does not; TPOT per request, the tokens each
made (greedy outputs with speculation must equal those without), as a table.

    python tests/support/spec_probe.py [REQUESTS]      (the trained model must exist)

A probe for the recorded run (docs/test-runs/), not yet the bench's: the bench and the
planner are to take it over.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))

from support import engine  # noqa: E402
from support.trained_model import ensure_trained_model  # noqa: E402

from zenvllm.runtime.health import healthy  # noqa: E402

IMAGE = "zenvllm/vllm-openai:0.32.0"
TOKENS = 64
METHODS = {
    "none": None,
    "ngram k=4": {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    },
    "draft k=3": {"method": "draft_model", "model": "/model/draft", "num_speculative_tokens": 3},
}


def workloads(model: Path) -> dict[str, list[list[int]]]:
    """Prompts as token ids: 'copies' is a held-out chunk and then its first 48 tokens
    again (what follows is in the prompt); 'fresh' is a chunk's first 96 tokens."""
    chunks = json.loads((model / "heldout.json").read_text())
    return {
        "copies": [c + c[:48] for c in chunks[:4]],
        "fresh": [c[:96] for c in chunks[4:8]],
    }


def one(port: int, ids: list[int]) -> tuple[float, list[str]]:
    """TPOT (ms) of one streamed greedy request of TOKENS tokens, and its tokens."""
    body = {
        "model": "/model",
        "prompt": ids,
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    made: list[str] = []
    first = last = 0.0
    with urllib.request.urlopen(request, timeout=300) as reply:
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            tokens = (choice.get("logprobs") or {}).get("tokens") or []
            if tokens:
                last = time.monotonic()
                first = first or last
                made += tokens
    return (last - first) * 1000 / max(1, len(made) - 1), made


def serve(model: Path, spec: dict | None, cpus: str) -> tuple[dict[str, list[float]], dict]:
    port = engine.free_port()
    extra: tuple[str, ...] = ("--enforce-eager",)
    if spec:
        extra += ("--speculative-config", json.dumps(spec))
    with engine.serve(
        IMAGE, model, port, *extra, run_opts=(f"--cpuset-cpus={cpus}",), keep_compiled=False
    ) as name:
        engine.wait_for(
            lambda: healthy(port) or "initialization failed" in engine.logs(name), 600, "/health"
        )
        if not healthy(port):
            raise SystemExit(engine.logs(name)[-4000:])
        tpot: dict[str, list[float]] = {}
        outputs: dict = {}
        for workload, prompts in workloads(model).items():
            one(port, prompts[0])  # warm
            for i, ids in enumerate(prompts):
                ms, made = one(port, ids)
                tpot.setdefault(workload, []).append(ms)
                outputs[f"{workload}-{i}"] = made
            # All of the workload's prompts at once: output tokens per second.
            start = time.monotonic()
            with ThreadPoolExecutor(len(prompts)) as pool:
                made_all = list(pool.map(lambda ids: one(port, ids)[1], prompts))
            rate = sum(map(len, made_all)) / (time.monotonic() - start)
            tpot.setdefault(f"{workload} x{len(prompts)} tok/s", []).append(rate)
        return tpot, outputs


def main() -> None:
    model = ensure_trained_model()
    cpus = sys.argv[1] if sys.argv[1:] else "1"
    results, outputs = {}, {}
    for label, spec in METHODS.items():
        results[label], outputs[label] = serve(model, spec, cpus)
        print(label, json.dumps(results[label]), flush=True)
    print(f"\n{TOKENS} greedy tokens per request, cpus {cpus}: batch 1's median TPOT (ms);")
    print("4 requests at once, output tokens/s")
    print("| method | copies TPOT | fresh TPOT | copies x4 tok/s | fresh x4 tok/s | greedy equal |")
    print("|---|---:|---:|---:|---:|---|")
    columns = ("copies", "fresh", "copies x4 tok/s", "fresh x4 tok/s")
    for label, tpot in results.items():
        same = outputs[label] == outputs["none"]
        cells = [f"{statistics.median(tpot[w]):.2f}" for w in columns]
        print(f"| {label} | {' | '.join(cells)} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
