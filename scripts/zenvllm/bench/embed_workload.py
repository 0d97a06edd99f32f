"""The embedding workload: what every configuration of `zenvllm bench --embed` is asked.

Inputs of one token length (random tokens, special tokens included, as vLLM's own
client draws them), sent as requests of a few batch sizes (inputs per request) at one
concurrency; per batch size a warm-up, then the measured repeats, each with its own
inputs (the same for every configuration). Measured: inputs/s, tokens/s and the
latency of a request (p50, p90, p99). Pure: bench/embed_runner.py runs it, with vLLM's
own client `vllm bench serve` (its embedding backends) from the vllm-openai image.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zenvllm.bench.layouts import MODEL_MOUNT
from zenvllm.bench.workloads import split
from zenvllm.core.errors import UserError

# vLLM's client: its backend and endpoint for each server kind (both are vLLM's own
# `vllm bench serve` backends; infinity serves /embeddings, without /v1).
BACKENDS = {
    "vllm": ("openai-embeddings", "/v1/embeddings"),
    "infinity": ("infinity-embeddings", "/embeddings"),
}
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class EmbedWorkload:
    """128-token inputs as a RAG index's chunks are, requests of 1, 8 and 32 of them (one
    query; a client's batch; infinity's default --batch-size) at concurrency 4, 512 inputs
    per batch size and repeat (~5 to 20 s each on 2 cores)."""

    input_len: int = 128
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    inputs: int = 512  # per batch size and repeat, all clients together
    concurrency: int = 4  # requests in flight, all clients together
    repeats: int = 2
    warmup_inputs: int = 64  # per batch size, before its repeats (at least one request)
    seed: int = 0
    enforce_eager: bool = False  # as the generation bench: when the image has no compiler

    def check(self, max_model_len: int) -> None:
        for name in ("input_len", "inputs", "concurrency", "repeats"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} {getattr(self, name)}: give 1 or more")
        if self.warmup_inputs < 0:
            raise UserError(f"warm-up inputs {self.warmup_inputs}: give 0 or more")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise UserError(f"--batch-sizes {self.batch_text()}: give sizes of 1 or more")
        uneven = [b for b in self.batch_sizes if self.inputs % b]
        if uneven:
            raise UserError(
                f"--num-prompts {self.inputs} is not a multiple of batch size {uneven[0]}: "
                "every request carries a whole batch"
            )
        if self.input_len < 3 or self.input_len > max_model_len:
            raise UserError(
                f"--input-len {self.input_len}: give 3 (two special tokens and one of text) "
                f"to {max_model_len} (the model's longest input)"
            )

    def batch_text(self) -> str:
        return ",".join(str(b) for b in self.batch_sizes)

    def requests(self, batch: int) -> int:
        return self.inputs // batch

    def warmup_requests(self, batch: int) -> int:
        return -(-self.warmup_inputs // batch) if self.warmup_inputs else 0

    def repeat(self, number: int) -> EmbedWorkload:
        """Inputs of repeat `number` (0: the warm-up), each its own: no cache between a
        client and a server can ever meet a measured input twice."""
        return replace(self, seed=self.seed + 1000 * number)


@dataclass(frozen=True)
class Share:
    """One client's part of one measurement: requests of `batch` inputs."""

    batch: int
    requests: int
    concurrency: int
    input_len: int
    seed: int

    @property
    def inputs(self) -> int:
        return self.requests * self.batch


def shares(w: EmbedWorkload, batch: int, clients: int, requests: int | None = None) -> list[Share]:
    """One client per instance: the requests and the concurrency split as evenly as they
    go, each client its own inputs (seed + its index)."""
    total = w.requests(batch) if requests is None else requests
    if clients > min(total, w.concurrency):
        raise UserError(
            f"{clients} instances need at least {clients} requests of batch {batch} and a "
            f"concurrency of {clients}; got {total} requests at concurrency {w.concurrency}"
        )
    return [
        Share(batch, n, c, w.input_len, w.seed + i)
        for i, (n, c) in enumerate(
            zip(split(total, clients), split(w.concurrency, clients), strict=True)
        )
    ]


def client_args(
    base_url: str, kind: str, share: Share, result_dir: str, result_name: str
) -> list[str]:
    """`vllm bench serve` arguments for one client: random inputs of input_len tokens
    (its random dataset counts the tokenizer's special tokens in), `--random-batch-size`
    inputs per request, every request's latency and error kept (--save-detailed)."""
    backend, endpoint = BACKENDS[kind]
    return [
        "bench",
        "serve",
        "--backend",
        backend,
        "--endpoint",
        endpoint,
        "--base-url",
        base_url,
        "--model",
        MODEL_MOUNT,
        "--tokenizer",
        MODEL_MOUNT,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(share.input_len),
        "--random-batch-size",
        str(share.batch),
        "--num-prompts",
        str(share.inputs),
        "--max-concurrency",
        str(share.concurrency),
        "--request-rate",
        "inf",
        "--seed",
        str(share.seed),
        "--percentile-metrics",
        "e2el",
        "--metric-percentiles",
        ",".join(str(p) for p in PERCENTILES),
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        result_dir,
        "--result-filename",
        result_name,
    ]


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """--batch-sizes 1,8,32 -> (1, 8, 32), in the order given, each once."""
    try:
        sizes = tuple(dict.fromkeys(int(t) for t in text.split(",") if t.strip()))
    except ValueError:
        raise UserError(f"--batch-sizes {text}: give whole numbers, e.g. 1,8,32") from None
    if not sizes or min(sizes) < 1 or max(sizes) > 4096:
        raise UserError(f"--batch-sizes {text}: give sizes from 1 to 4096, e.g. 1,8,32")
    return sizes
