"""The workloads: what every configuration of the bench is asked to do, one per model kind.

A generating model's (Workload): prompt and output lengths, prompts, concurrency,
repeats, warm-up and batch 1. A pooling model's (PoolingWorkload): inputs of one token
length sent in requests of a few batch sizes. Each in its full and --quick sizes, and
how it splits over the clients of a run (one per instance) and draws fresh inputs for
each repeat. Pure: bench/layouts.py holds the configurations they run on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from zenvllm.core.errors import UserError


def at_least_one(workload: object, names: tuple[str, ...]) -> None:
    """Each named field 1 or more, refused by its flag's name."""
    for name in names:
        if getattr(workload, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} {getattr(workload, name)}: give 1 or more")


@dataclass(frozen=True)
class Workload:
    """What every configuration is asked to do; AMD's is 128 in / 128 out, 1024 prompts,
    batch 128 (8 waves). Ours keeps the shape (equal in/out, 8 waves) at 1/4 the size:
    a repeat of the 26 M-parameter bench model takes ~40 s on 2 cores and repeats
    spread by about +-5% (the 0.2 M test model's spread by +-30%)."""

    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int
    repeats: int
    warmup_prompts: int
    seed: int = 0
    enforce_eager: bool = False  # --quick only: halves server start-up, same for every config
    # Batch 1: after the repeats, this many prompts one at a time to the first instance
    # (0: none); three give a median, each costs output_len decode steps.
    batch1_prompts: int = 3

    def check(self, max_model_len: int) -> None:
        at_least_one(self, ("input_len", "output_len", "num_prompts", "concurrency", "repeats"))
        if self.warmup_prompts < 0:
            raise UserError(f"warm-up prompts {self.warmup_prompts}: give 0 or more")
        if self.batch1_prompts < 0:
            raise UserError(f"--batch1-prompts {self.batch1_prompts}: give 0 or more")
        if self.input_len + self.output_len > max_model_len:
            raise UserError(
                f"--input-len {self.input_len} + --output-len {self.output_len} exceeds "
                f"--max-model-len {max_model_len}; shorten them or raise --max-model-len"
            )

    def repeat(self, number: int) -> Workload:
        """The prompts of repeat `number` (0: the warm-up). Each repeat draws its own: a
        server that caches prompts (llama.cpp keeps each slot's last one, vLLM has
        prefix caching) must never meet a measured prompt twice; llama.cpp's TTFT fell
        from 5.3 s to 0.24 s on a repeat of the same prompts."""
        return replace(self, seed=self.seed + 1000 * number)

    def batch1(self) -> Workload:
        """Batch 1: batch1_prompts at concurrency 1, one client, the same lengths; its own
        prompts (a seed past every repeat's), the same for every configuration."""
        return replace(
            self,
            num_prompts=self.batch1_prompts,
            concurrency=1,
            warmup_prompts=0,
            repeats=1,
            seed=self.seed + 1000 * (self.repeats + 1),
        )

    def shares(self, clients: int) -> list[Workload]:
        """One client per instance: prompts and concurrency split as evenly as they go."""
        if clients > min(self.num_prompts, self.concurrency):
            raise UserError(
                f"{clients} instances need at least {clients} prompts and a concurrency of "
                f"{clients} (one client each); got --num-prompts {self.num_prompts}, "
                f"--concurrency {self.concurrency}"
            )
        return [
            replace(
                self,
                num_prompts=split(self.num_prompts, clients)[i],
                concurrency=split(self.concurrency, clients)[i],
                warmup_prompts=split(self.warmup_prompts, clients)[i],
                seed=self.seed + i,  # distinct prompts per client, as one client would send
            )
            for i in range(clients)
        ]


def split(total: int, parts: int) -> list[int]:
    size, extra = divmod(total, parts)
    return [size + (1 if i < extra else 0) for i in range(parts)]


FULL = Workload(
    input_len=128, output_len=128, num_prompts=256, concurrency=32, repeats=3, warmup_prompts=32
)
QUICK = Workload(
    input_len=32,
    output_len=32,
    num_prompts=16,
    concurrency=4,
    repeats=1,
    warmup_prompts=4,
    enforce_eager=True,
)


# -- a pooling model's -------------------------------------------------------------

# The request latencies a pooling run reports (vLLM's client computes the same).
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class PoolingWorkload:
    """128-token inputs as a RAG index's chunks are, requests of 1, 8 and 32 of them (one
    query; a client's batch; infinity's default --batch-size) at concurrency 4, 512 inputs
    per batch size and repeat (~5 to 20 s each on 2 cores). Per batch size a warm-up,
    then the measured repeats, each with its own inputs (the same for every
    configuration)."""

    input_len: int = 128
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    inputs: int = 512  # per batch size and repeat, all clients together
    concurrency: int = 4  # requests in flight, all clients together
    repeats: int = 2
    warmup_inputs: int = 64  # per batch size, before its repeats (at least one request)
    seed: int = 0
    enforce_eager: bool = False  # as the generation bench: when the image has no compiler

    def check(self, max_model_len: int) -> None:
        at_least_one(self, ("input_len", "inputs", "concurrency", "repeats"))
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

    def repeat(self, number: int) -> PoolingWorkload:
        """Inputs of repeat `number` (0: the warm-up), each its own: no cache between a
        client and a server can ever meet a measured input twice."""
        return replace(self, seed=self.seed + 1000 * number)

    def shares(self, batch: int, clients: int, requests: int | None = None) -> list[BatchShare]:
        """One client per instance: the requests and the concurrency split as evenly as
        they go, each client its own inputs (seed + its index)."""
        total = self.requests(batch) if requests is None else requests
        if clients > min(total, self.concurrency):
            raise UserError(
                f"{clients} instances need at least {clients} requests of batch {batch} and a "
                f"concurrency of {clients}; got {total} requests at concurrency {self.concurrency}"
            )
        return [
            BatchShare(batch, n, c, self.input_len, self.seed + i)
            for i, (n, c) in enumerate(
                zip(split(total, clients), split(self.concurrency, clients), strict=True)
            )
        ]


@dataclass(frozen=True)
class BatchShare:
    """One client's part of one pooling measurement: requests of `batch` inputs."""

    batch: int
    requests: int
    concurrency: int
    input_len: int
    seed: int

    @property
    def inputs(self) -> int:
        return self.requests * self.batch


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """--batch-sizes 1,8,32 -> (1, 8, 32), in the order given, each once."""
    try:
        sizes = tuple(dict.fromkeys(int(t) for t in text.split(",") if t.strip()))
    except ValueError:
        raise UserError(f"--batch-sizes {text}: give whole numbers, e.g. 1,8,32") from None
    if not sizes or min(sizes) < 1 or max(sizes) > 4096:
        raise UserError(f"--batch-sizes {text}: give sizes from 1 to 4096, e.g. 1,8,32")
    return sizes


POOLING_FULL = PoolingWorkload()
POOLING_QUICK = PoolingWorkload(
    input_len=32, batch_sizes=(1, 8), inputs=32, concurrency=2, repeats=1, warmup_inputs=8
)
# Either kind's workload, where the one runner handles both alike (its servers' flags).
AnyWorkload = TypeVar("AnyWorkload", Workload, PoolingWorkload)
