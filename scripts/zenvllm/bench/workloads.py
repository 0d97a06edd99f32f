"""The workload: what every configuration of the bench is asked to do.

Its shape (prompt and output lengths, prompts, concurrency, repeats, warm-up and
batch 1), the full and --quick sizes, and how one workload splits over the
clients of a run (one per instance) and draws fresh prompts for each repeat.
Pure: bench/layouts.py holds the configurations it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zenvllm.core.errors import UserError


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
        for name in ("input_len", "output_len", "num_prompts", "concurrency", "repeats"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} {getattr(self, name)}: give 1 or more")
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
