"""The order a run measures its configurations in, pure.

A VM's speed drifts over a run (a neighbour's load, the host's clocks), so a
configuration measured in one block of repeats and compared with stock's block minutes
earlier carries that drift in its ratio. In rounds, each repeat is a round over every
configuration, the order reversed each round (A B C, C B A, A B C: the ABBA design),
so a drift that is linear in time falls on every configuration alike and repeat r of
each one pairs with stock's repeat r; each round starts the configuration's servers
again. Reversed, the first round runs from the last configuration: the second of two
runs that should agree whatever the order. The rounds are recorded in meta.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from zenvllm.bench.catalogue import STOCK
from zenvllm.bench.results import Run, Summary

BLOCKS = "blocks"  # each configuration's repeats at one start of its servers
ROUNDS = "rounds"  # a round per repeat, the order reversed each round
ORDERS = (BLOCKS, ROUNDS)


@dataclass(frozen=True)
class Order:
    """How a run orders its configurations: `--order` and `--reverse`."""

    mode: str = BLOCKS
    reverse: bool = False  # the first round from the last configuration


@dataclass(frozen=True)
class Visit:
    """One start of a configuration's servers: the repeats it measures, and whether it is
    the configuration's last (batch 1, quality and how it ran are measured once, there)."""

    index: int  # the configuration's place in the run's list
    repeats: tuple[int, ...]
    last: bool = True


def visits(count: int, repeats: int, order: Order) -> list[list[Visit]]:
    """The run's rounds (one for BLOCKS), each a list of visits in the order they run:
    `count` configurations, `repeats` repeats each."""
    forward = list(range(count))
    if order.mode == BLOCKS:
        first = forward[::-1] if order.reverse else forward
        return [[Visit(i, tuple(range(1, repeats + 1))) for i in first]]
    rounds = []
    for number in range(1, repeats + 1):
        given = forward if (number % 2 == 1) != order.reverse else forward[::-1]
        rounds.append([Visit(i, (number,), number == repeats) for i in given])
    return rounds


def recorded(names: list[str], rounds: list[list[Visit]], mode: str) -> dict[str, Any]:
    """meta.order: how the run was ordered, each round's configurations as they ran."""
    return {"mode": mode, "rounds": [[names[v.index] for v in round_] for round_ in rounds]}


def with_spread(summaries: list[Summary], runs: list[Run]) -> list[Summary]:
    """Each summary with its ratio's spread: the lowest and highest of its repeats'
    output tok/s over stock's repeat of the same number (in rounds, the same round)."""
    stock = {r.repeat: r.output_tok_s for r in runs if r.config == STOCK and r.output_tok_s > 0}
    out = []
    for s in summaries:
        ratios = [
            r.output_tok_s / stock[r.repeat]
            for r in runs
            if r.config == s.config and r.repeat in stock
        ]
        if ratios:
            s = replace(s, ratio_min=round(min(ratios), 3), ratio_max=round(max(ratios), 3))
        out.append(s)
    return out
