"""Speculative decoding: whether an instance drafts tokens that one pass of the model then
verifies, by which method and how many, decided from what was measured on a CPU.

Measured on an AMD EPYC Zen 4 core (docs/test-runs/2026-11-29-zen4-speculation.txt: the
trained Llama, vLLM 0.32's CPU backend, greedy outputs equal with and without):
- n-gram prompt lookup, 4 tokens: batch-1 time per output token 0.49x on prompts the
  answer copies from and 0.48x on fresh ones; 4 requests at once, +34% output tokens/s
  where the answer copies the prompt, -31% where it does not;
- a 1-layer draft model for the 3-layer model: slower everywhere (1.17x at batch 1).
So n-gram pays where few requests run at once or answers quote their prompts (RAG,
editing), and loses on a server shared by many clients that do not; a draft model
loses on a CPU. An instance is planned for up to vLLM's 256 sequences at once, so the
planner leaves speculation off unless the operator says the traffic is of the first
kind (`speculation: ngram`). Pure; standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from zenvllm.core.errors import PlanError

CHOICES = ("auto", "off", "ngram")
NGRAM_TOKENS = 4  # the measured count: 4 drafted, then one pass verifies them
NGRAM_LOOKUP = (2, 4)  # the shortest and longest n-gram looked up in the prompt
EVIDENCE = "docs/test-runs/2026-11-29-zen4-speculation.txt"
FLAG = "--speculative-config"


@dataclass(frozen=True)
class Speculation:
    method: str  # "ngram", or "" for none
    tokens: int
    why: str

    def serve_args(self) -> tuple[str, ...]:
        """vLLM's flag for it, or none."""
        if not self.method:
            return ()
        config = {
            "method": self.method,
            "num_speculative_tokens": self.tokens,
            "prompt_lookup_min": NGRAM_LOOKUP[0],
            "prompt_lookup_max": NGRAM_LOOKUP[1],
        }
        return (f"{FLAG}={json.dumps(config, separators=(',', ':'))}",)


OFF_WHY = (
    "speculative decoding off: n-gram lookup halved the time per token at batch 1 but "
    "lost 31% of the output tokens/s at 4 requests at once whose answers do not copy "
    "their prompt, and a draft model was slower everywhere, on a Zen 4 core "
    f"({EVIDENCE}); this instance serves up to 256 at once. `speculation: ngram` for "
    "traffic of few requests at a time or answers that quote the prompt"
)


def decide(choice: str, runner: str, split: bool) -> Speculation:
    """The instance's speculation for the operator's `choice` (CHOICES), its runner
    ("generate" decodes; a pooling model does not) and whether its copy is split (tensor
    or pipeline parallel: not measured)."""
    if choice not in CHOICES:
        raise PlanError(f"speculation {choice!r} is not one of {', '.join(CHOICES)}")
    if choice != "ngram":
        why = OFF_WHY if choice == "auto" else "speculative decoding off (speculation: off)"
        return Speculation("", 0, why if runner == "generate" else "")
    if runner != "generate":
        raise PlanError(
            f"speculation ngram drafts tokens, and this model is served as {runner!r}, "
            "which generates none: give speculation auto or off"
        )
    if split:
        raise PlanError(
            "speculation ngram is measured on whole copies only, and this copy is cut over "
            "ranks or hosts: give speculation auto, or serve whole copies"
        )
    why = (
        f"speculative decoding: n-gram prompt lookup, {NGRAM_TOKENS} tokens (speculation: "
        "ngram): batch-1 time per token 0.49x where the answer copies the prompt and 0.48x "
        f"where not, +34% output tokens/s at 4 at once when it copies, -31% when it does "
        f"not, on a Zen 4 core ({EVIDENCE}); greedy outputs unchanged"
    )
    return Speculation("ngram", NGRAM_TOKENS, why)
