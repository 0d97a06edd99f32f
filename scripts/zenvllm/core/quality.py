"""How far a served configuration's outputs are from its float32 reference: the
perplexity of held-out text from the logprobs the server gave its tokens, and the
bound each weight format may stray from the reference before it is judged wrong.

Pure: the numbers come from a server (bench/quality.py asks vLLM's completions API) or
from the reference's own record (the model's maker measures it in float32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# How much higher than the float32 reference a format's perplexity may be, as a share
# of it. Set from what each format costs where it is measured on real models, with room
# for a small model's larger share of rounding per weight:
# - float32: only the kernels' order of sums differs (oneDNN, zentorch, PACE);
#   well under 0.1% on any model.
# - bfloat16: 8 bits of mantissa per weight and activation; published gaps are 0.1
#   to 0.5% on 7 B models (perplexity on WikiText); a 3-layer model of 2 M weights
#   measured here loses 0.1 to 0.2%.
# - INT8 W8A8 (SmoothQuant): 0.5 to 3% on 7 B models.
# - INT4 weights (AWQ, GPTQ, group 128): 2 to 5% on 7 B models, more on small ones.
# A kernel that returns wrong numbers lands far beyond all of them (tens of percent to
# orders of magnitude: the checks' sabotaged runs).
BOUNDS = {
    "float32": 0.005,
    "bfloat16": 0.02,
    "w8a8": 0.05,
    "awq": 0.15,
    "gptq": 0.15,
    "int4": 0.15,  # compressed-tensors W4A16: INT4 weights as AWQ's and GPTQ's
}
# How many greedy tokens a configuration makes after the fixed prompt, and how many of
# the held-out ids that prompt is; at most how many ids a scored chunk holds.
GREEDY_TOKENS = 32
GREEDY_PROMPT = 32
CHUNK = 256


def perplexity(logprobs: Sequence[float]) -> float:
    """exp of the mean negative log-likelihood of the tokens whose logprobs are given
    (each position's, given the ones before it; a text's first token has none)."""
    if not logprobs:
        raise ValueError("no logprobs: a perplexity needs at least one scored token")
    if not all(math.isfinite(lp) and lp <= 0 for lp in logprobs):
        bad = next(lp for lp in logprobs if not (math.isfinite(lp) and lp <= 0))
        raise ValueError(f"a logprob of {bad} is no log-probability (finite, at most 0)")
    return math.exp(-sum(logprobs) / len(logprobs))


@dataclass(frozen=True)
class Judged:
    """A configuration's perplexity against its reference, within its format's bound."""

    fmt: str
    measured: float
    reference: float

    @property
    def gap(self) -> float:
        """How much higher than the reference, as a share of it (negative: lower)."""
        return self.measured / self.reference - 1

    @property
    def bound(self) -> float:
        return BOUNDS[self.fmt]

    @property
    def within(self) -> bool:
        # Lower by more than the bound is wrong too: the reference is what the model
        # computes, and a kernel that scores text better than that is not computing it.
        return abs(self.gap) <= self.bound

    def said(self) -> str:
        verdict = "within" if self.within else "BEYOND"
        return (
            f"perplexity {self.measured:.4f} against {self.reference:.4f} in float32: "
            f"{self.gap:+.2%}, {verdict} {self.fmt}'s bound of {self.bound:.1%}"
        )


def judge(fmt: str, measured: float, reference: float) -> Judged:
    """The verdict on a measured perplexity; an unknown format is refused by name."""
    if fmt not in BOUNDS:
        raise ValueError(f"no quality bound for format {fmt!r}: one of {', '.join(BOUNDS)}")
    if not (reference > 0 and math.isfinite(reference)):
        raise ValueError(f"a reference perplexity of {reference} is not one")
    return Judged(fmt, measured, reference)


def greedy_agreement(tokens: Sequence[int], reference: Sequence[int]) -> float:
    """The share of the reference's greedy tokens a configuration's greedy run matches,
    position by position (a run cut short matches none of what it lacks)."""
    if not reference:
        raise ValueError("no reference tokens to agree with")
    same = sum(1 for a, b in zip(tokens, reference, strict=False) if a == b)
    return same / len(reference)


def format_of(method: str | None, label: str, dtype: str) -> str:
    """The format a configuration's quality is judged as: its quantization's where its
    weights are quantized (`method`: config.json's quant_method, `label`: how
    core/quantization.py words it), else the dtype it serves in."""
    if method in ("awq", "gptq"):
        return method
    if method == "compressed-tensors":
        return "w8a8" if "W8A8" in label else "int4" if "W4" in label else label
    return method or dtype


def chunks(segments: Sequence[Sequence[int]], max_model_len: int, cap: int) -> list[list[int]]:
    """Held-out `segments` of token ids cut into chunks of at most CHUNK ids, each short
    enough to be served with one token after it (max_model_len - 1), at most `cap` ids in
    all; a chunk of one id scores nothing and is left out."""
    size = min(CHUNK, max_model_len - 1)
    if size < 2:
        raise ValueError(f"a served length of {max_model_len} leaves no chunk to score")
    out: list[list[int]] = []
    left = cap
    for ids in segments:
        for at in range(0, len(ids), size):
            piece = list(ids[at : at + min(size, left)])
            if len(piece) > 1:
                out.append(piece)
                left -= len(piece)
            if left < 2:
                return out
    return out


def token_ids(tokens: Sequence[str]) -> list[int]:
    """vLLM's tokens as ids ("token_id:123", its return_tokens_as_token_ids form)."""
    out = []
    for token in tokens:
        head, sep, digits = token.partition(":")
        if head != "token_id" or not sep or not digits.isdigit() or len(digits) > 12:
            raise ValueError(f"{token[:40]!r} is not a token id (token_id:N)")
        out.append(int(digits))
    return out
