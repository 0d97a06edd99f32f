"""Do two runs of the same configurations agree, pure: each configuration's ratio to
stock in one run lies within the spread the other reports (the range of its repeats'
ratios, each over stock's repeat of the same round: bench/order.py), both ways. Two
runs in opposite orders (`--reverse`) that agree show the order did not make the
ratios; `python -m zenvllm.bench.check RUN --agrees-with OTHER` asks it.
"""

from __future__ import annotations

from typing import Any

from zenvllm.bench import kinds
from zenvllm.bench.catalogue import STOCK
from zenvllm.bench.document import GENERATION

# What must match for two runs to measure the same thing (a workload field each).
SAME_WORKLOAD = ("input_len", "output_len", "num_prompts", "concurrency", "enforce_eager")


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
    return found


def disagreements(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Each configuration whose ratio in one run lies outside the other's spread."""
    found = comparable(a, b)
    if found:
        return found
    theirs = by_config(b)
    for name, mine in by_config(a).items():
        other = theirs[name]
        for label, ratio, spread in (
            ("the first", mine["ratio"], other),
            ("the second", other["ratio"], mine),
        ):
            low, high = spread["ratio_min"], spread["ratio_max"]
            if not low <= ratio <= high:
                found.append(
                    f"{name}: {label} run's ratio to stock {ratio:.3f}x is outside the other "
                    f"run's spread {low:.3f}-{high:.3f}"
                )
    return found


def agreement_line(a: dict[str, Any], b: dict[str, Any]) -> str:
    """What holds, in words, when disagreements gives nothing."""
    theirs = by_config(b)
    shown = ", ".join(
        f"{name} {mine['ratio']:.3f}x and {theirs[name]['ratio']:.3f}x"
        for name, mine in sorted(by_config(a).items())
    )
    return f"the runs agree: each ratio to stock within the other's spread ({shown})"
