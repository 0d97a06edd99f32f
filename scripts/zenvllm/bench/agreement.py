"""Do two runs of the same configurations agree, pure: whether the order a run measured in
moved any configuration's ratio to stock beyond what its repeats' own noise gives.

Each run gives a configuration's ratio repeat by repeat (its output tok/s over stock's in
the same round: bench/order.py). If the order made no difference, the two runs' repeats
are alike, and dealing the pooled repeats into two runs in every way (Mann-Whitney's
exact test, on ranks) sets them as far apart as the runs' own in a share `p` of the
deals (SciPy's `mannwhitneyu(method="exact")` gives the same p, to 1e-16, on 150 random
pairs of runs of 3 to 6 repeats tried by hand: the bench does not carry SciPy for it).
The runs disagree on a configuration when p <= ALPHA: its repeats in one run sit above
the other's. Whether each median merely lies within the other run's spread (its
repeats' lowest and highest) is no test of the order: two runs of three repeats drawn
from one distribution fail that, both ways, in 12 of the 20 equally likely deals of
their six repeats (3 times in 5; at five repeats each, 72 of 252). Two runs in
opposite orders (`--reverse`) that agree show the order did not make the ratios;
`python -m zenvllm.bench.check RUN --agrees-with OTHER` asks it.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable
from typing import Any

from zenvllm.bench import guard, kinds
from zenvllm.bench.catalogue import STOCK
from zenvllm.bench.document import GENERATION

# What must match for two runs to measure the same thing (a workload field each).
SAME_WORKLOAD = ("input_len", "output_len", "num_prompts", "concurrency", "enforce_eager")
# The share of deals at or under which the runs disagree: the lowest p that three
# repeats against three can reach (2 of the 20 deals: each run's repeats all above the
# other's), so a check of the bench's usual three repeats can fail; a run alike in both
# orders is failed at most this often.
ALPHA = 0.1
# Deals counted one by one up to this many (nine repeats a run: 48,620); beyond, this
# many drawn with a fixed seed, so a verdict is the same every time it is asked.
EXACT_DEALS = 50_000


def by_config(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["config"]: s for s in result["summary"] if s["config"] != STOCK}


def comparable(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Why the two runs do not measure the same configurations the same way ([]: they do)."""
    named = {kinds.of_document(r).name for r in (a, b)}
    if named != {GENERATION}:
        return [f"agreement compares runs of a generating model; these are {sorted(named)}"]
    found = []
    names = (sorted(by_config(a)), sorted(by_config(b)))
    if names[0] != names[1]:
        found.append(f"the runs measured different configurations: {names[0]} and {names[1]}")
    wa, wb = a["meta"]["workload"], b["meta"]["workload"]
    found += [
        f"the runs' workloads differ in {key}: {wa.get(key)!r} and {wb.get(key)!r}"
        for key in SAME_WORKLOAD
        if wa.get(key) != wb.get(key)
    ]
    for label, result in (("the first", a), ("the second", b)):
        unpaired = [n for n, s in by_config(result).items() if s.get("ratio_min") is None]
        if unpaired:
            found.append(
                f"{label} run reports no spread of the ratio for {', '.join(unpaired)} (a run "
                "written before runs recorded their order, or without stock): run it again"
            )
    if not found:
        found += too_few(repeat_ratios(a), repeat_ratios(b))
    return found


def too_few(mine: dict[str, list[float]], theirs: dict[str, list[float]]) -> list[str]:
    """The configurations whose repeats are too few for any order to show: even runs
    whose repeats all sit apart would be dealt so in more than ALPHA of the deals."""
    found = []
    for name in sorted(set(mine) & set(theirs)):
        n, m = len(mine[name]), len(theirs[name])
        if 2 / math.comb(n + m, n) > ALPHA:
            found.append(
                f"{name}: {n} and {m} repeats cannot show an order (any split of them "
                f"happens by chance in more than {ALPHA} of the deals): run each "
                "with --repeats 3 or more"
            )
    return found


def repeat_ratios(result: dict[str, Any]) -> dict[str, list[float]]:
    """Each configuration's ratio to stock, repeat by repeat (in rounds, round by round),
    as the speed guard pairs them; those without repeats of their own (the quality
    reference, scored only) left out."""
    ratios = {name: guard.repeat_ratios(result, name) for name in by_config(result)}
    return {name: found for name, found in ratios.items() if found}


def deals(count: int, first: int) -> tuple[list[tuple[int, ...]], int]:
    """The ways to deal `count` pooled repeats into a first run of `first` (as index
    tuples) and how many there are in all: every one, or the runs' own deal (the first
    `first`) and EXACT_DEALS drawn with a seed, so a drawn p is never 0."""
    total = math.comb(count, first)
    if total <= EXACT_DEALS:
        return list(itertools.combinations(range(count), first)), total
    draw = random.Random(0)
    drawn = [tuple(sorted(draw.sample(range(count), first))) for _ in range(EXACT_DEALS)]
    return [tuple(range(first)), *drawn], total


def ranks(values: list[float]) -> list[float]:
    """Each value's rank among them, from 1 (equal values share their mean rank)."""
    ordered = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and values[ordered[end + 1]] == values[ordered[start]]:
            end += 1
        for i in ordered[start : end + 1]:
            out[i] = (start + end) / 2 + 1
        start = end + 1
    return out


def order_p(mine: list[float], theirs: list[float]) -> tuple[float, int]:
    """Mann-Whitney's exact test: the share of deals of the pooled repeats into runs of
    these sizes whose ranks sit at least as far from alike as these two runs' do (how
    many of one run's repeats are above the other's, against half of all pairs), and how
    many deals there are."""
    rank = ranks(mine + theirs)
    alike = len(mine) * (len(rank) + 1) / 2  # the first run's rank sum, mixed in

    def apart(chosen: Iterable[int]) -> float:
        return abs(sum(rank[i] for i in chosen) - alike)

    seen = apart(range(len(mine)))
    dealt, total = deals(len(rank), len(mine))
    # A tolerance for the float rounding of equal sums (shared ranks are halves).
    as_far = sum(apart(chosen) >= seen - 1e-9 for chosen in dealt)
    return as_far / len(dealt), total


def verdicts(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """Each configuration's (p, deals) between the two runs (order_p)."""
    mine, theirs = repeat_ratios(a), repeat_ratios(b)
    return {name: order_p(mine[name], theirs[name]) for name in sorted(mine) if name in theirs}


def disagreements(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Each configuration whose repeats in one run sit apart from the other's (p <= ALPHA)."""
    found = comparable(a, b)
    if found:
        return found
    ours, theirs = by_config(a), by_config(b)
    for name, (p, total) in verdicts(a, b).items():
        if p <= ALPHA:
            found.append(
                f"{name}: the order moved its ratio to stock: {ours[name]['ratio']:.3f}x "
                f"({ours[name]['ratio_min']:.3f}-{ours[name]['ratio_max']:.3f}) against "
                f"{theirs[name]['ratio']:.3f}x ({theirs[name]['ratio_min']:.3f}-"
                f"{theirs[name]['ratio_max']:.3f}); of the {total} deals of their repeats "
                f"into two runs, a share of {p:.3f} sets the runs' repeats as far apart (at most "
                f"{ALPHA} is the order, not the noise)"
            )
    return found


def agreement_line(a: dict[str, Any], b: dict[str, Any]) -> str:
    """What holds, in words, when disagreements gives nothing."""
    ours, theirs = by_config(a), by_config(b)
    shown = ", ".join(
        f"{name} {ours[name]['ratio']:.3f}x and {theirs[name]['ratio']:.3f}x (p {p:.2f})"
        for name, (p, _) in verdicts(a, b).items()
    )
    return (
        f"the runs agree: no ratio to stock moved by the order beyond its repeats' noise "
        f"(p > {ALPHA}: {shown})"
    )
