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

from dataclasses import dataclass
from typing import Any

BLOCKS = "blocks"  # each configuration's repeats at one start of its servers
ROUNDS = "rounds"  # a round per repeat, the order reversed each round
ORDERS = (BLOCKS, ROUNDS)


@dataclass(frozen=True)
class Visit:
    """One start of a configuration's servers: the repeats it measures, and whether it is
    the configuration's last (batch 1, quality and how it ran are measured once, there)."""

    index: int  # the configuration's place in the run's list
    repeats: tuple[int, ...]
    last: bool = True


def visits(count: int, repeats: int, mode: str, reverse: bool) -> list[list[Visit]]:
    """The run's rounds (one for BLOCKS), each a list of visits in the order they run:
    `count` configurations, `repeats` repeats each."""
    forward = list(range(count))
    if mode == BLOCKS:
        order = forward[::-1] if reverse else forward
        return [[Visit(i, tuple(range(1, repeats + 1))) for i in order]]
    rounds = []
    for number in range(1, repeats + 1):
        order = forward if (number % 2 == 1) != reverse else forward[::-1]
        rounds.append([Visit(i, (number,), number == repeats) for i in order])
    return rounds


def recorded(names: list[str], rounds: list[list[Visit]], mode: str) -> dict[str, Any]:
    """meta.order: how the run was ordered, each round's configurations as they ran."""
    return {"mode": mode, "rounds": [[names[v.index] for v in round_] for round_ in rounds]}
