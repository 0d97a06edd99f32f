"""The speed guard: the planner's layout against stock vLLM, both measured in one run,
must keep the advantage the recorded runs showed, less their measured spread.

Only ratios are compared (these machines are noisy; absolute figures move with the
load), and only against recorded runs of the same model on as many CPUs, in vLLM's
compiled mode, with stock and the plan in the same dtypes as this run's. CI gives stock
the planner's (`zenvllm bench --stock-dtype plan`): the ratio is the layout's alone,
and where the CPU emulates bf16 (the planner serves float32 there: core/dtype.py) it
is judged against runs recorded on that path. The floor is the lowest ratio a recorded
repeat reached less the spread of all recorded repeats (across runs and machines), so a
run as good as the recorded ones passes and a planner that lost its advantage fails.

    python -m zenvllm.bench.guard OUT [--recorded docs/bench] [--config auto]

--config judges another configuration of the run as if it were the plan: CI's sabotaged
plan (SABOTAGED: the plan without what makes it faster than stock at one dtype) must
fail. Runs under the AVX2 view (a Xeon's cores on Zen 3's path) are kept apart, in
docs/bench/avx2-view: there the binding gained nothing, so a run under the view is
judged against them (--recorded) and sabotaged of its dtype.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from zenvllm.core import gate
from zenvllm.deploy import data

PLANNER, BASELINE = "auto", "stock"
# The plan without what makes it faster than stock at one dtype: stock's thread binding.
# That is the layout's gain on every CPU measured, a real Zen 3 serving float32 too
# (docs/bench/qwen0.5b-zen3: auto 1.62x-1.70x, this 0.90x-0.96x of stock). CI's run
# must see the guard fail it.
SABOTAGED = "auto-stock-bind"
RECORDED = data.ROOT.parent.parent / "docs" / "bench"
# The runs under the AVX2 view, apart: the floor of a run under the view, and no other.
VIEW_RECORDED = RECORDED / "avx2-view"
FIX = "run `zenvllm bench --configs stock,auto` into it again"


def repeat_ratios(doc: dict[str, Any], config: str = PLANNER) -> list[float]:
    """The configuration's output tok/s over stock's, repeat by repeat."""
    by = {
        (r["config"], r["repeat"]): r["output_tok_s"]
        for r in doc.get("runs", [])
        if r.get("output_tok_s", 0) > 0
    }
    repeats = sorted({rep for (name, rep) in by if name == config})
    return [by[config, n] / by[BASELINE, n] for n in repeats if (BASELINE, n) in by]


def dtypes(meta: dict[str, Any]) -> tuple[str, str]:
    """(stock's dtype, the plan's) in a run. Runs from before the bench recorded them ran
    on CPUs that compute bf16 (docs/benchmarks.md: a Xeon with AMX, Zen 4, Zen 5), where
    both served it."""
    return meta.get("stock_dtype", "bfloat16"), meta.get("plan_dtype", "bfloat16")


def comparable(doc: dict[str, Any], model: str, cpus: int, pair: tuple[str, str]) -> bool:
    meta = doc.get("meta", {})
    return (
        meta.get("model") == model
        and meta.get("cpus") == cpus
        and not meta.get("workload", {}).get("enforce_eager", False)
        and not meta.get("serve_env")  # the plan as planned, not an experiment on it
        and dtypes(meta) == pair
    )


def floor(
    recorded: list[dict[str, Any]],
    model: str,
    cpus: int,
    pair: tuple[str, str] = ("bfloat16", "bfloat16"),
) -> tuple[float, str] | None:
    """The lowest ratio any recorded repeat with stock and the plan in `pair`'s dtypes
    reached, less the spread of all of them (highest minus lowest, across runs and
    machines); None when nothing compares."""
    runs = [
        r for r in (repeat_ratios(d) for d in recorded if comparable(d, model, cpus, pair)) if r
    ]
    pooled = [ratio for run in runs for ratio in run]
    if not pooled:
        return None
    spread = max(pooled) - min(pooled)
    basis = (
        f"{len(pooled)} recorded repeats of {model} on {cpus} CPUs, stock in {pair[0]} and "
        f"the plan in {pair[1]}, in {len(runs)} run(s) ({min(pooled):.3f}x-{max(pooled):.3f}x)"
    )
    return round(min(pooled) - spread, 3), basis


def judge(
    doc: dict[str, Any], recorded: list[dict[str, Any]], config: str = PLANNER
) -> tuple[bool, str]:
    """Whether this run's `config` keeps the planner's recorded advantage over stock, and
    the sentence that says so."""
    meta = doc["meta"]
    ratios = repeat_ratios(doc, config)
    if not ratios:
        return False, f"no {config} and {BASELINE} figures of one run to compare; {FIX}"
    pair = dtypes(meta)
    found = floor(recorded, meta["model"], meta["cpus"], pair)
    if found is None:
        return False, (
            f"no recorded compiled-mode run of {meta['model']} on {meta['cpus']} CPUs with "
            f"stock in {pair[0]} and the plan in {pair[1]} to set the floor from; record one "
            f"in {RECORDED}"
        )
    limit, basis = found
    ratio = statistics.median(ratios)
    verdict = "holds" if ratio >= limit else "FAILED"
    return ratio >= limit, (
        f"speed guard {verdict}: {config} / {BASELINE} = {ratio:.3f}x in this run, floor "
        f"{limit:.3f}x: the lowest of {basis} less their spread"
    )


def read_result(path: Path) -> dict[str, Any]:
    return gate.obj(gate.read_json(path, gate.DOCUMENT, FIX), str(path), FIX)


def recorded_documents(where: Path = RECORDED) -> list[dict[str, Any]]:
    """The recorded runs of generating models (`meta.kind: generation`, or none in a run
    recorded before documents said; an embedding run, `embed`, has no output tokens to
    guard)."""
    found = [read_result(p) for p in sorted(where.glob("*/results.json"))]
    return [d for d in found if d.get("meta", {}).get("kind", "generation") == "generation"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zenvllm.bench.guard", description=__doc__)
    parser.add_argument("out", type=Path, help="the bench's output directory (results.json)")
    parser.add_argument("--recorded", type=Path, default=RECORDED)
    parser.add_argument("--config", default=PLANNER, help="the configuration judged as the plan")
    args = parser.parse_args(argv)
    try:
        doc = read_result(args.out / "results.json")
        recorded = recorded_documents(args.recorded)
    except gate.InputError as err:
        print(f"speed guard: {err}", file=sys.stderr)
        return 2
    ok, sentence = judge(doc, recorded, args.config)
    print(sentence)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
