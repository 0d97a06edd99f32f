"""The speed guard: the planner's layout against stock vLLM, both measured in one run,
must keep the advantage the recorded runs showed, less their measured spread.

Only ratios are compared (these machines are noisy; absolute figures move with the
load), and only against recorded runs of the same model on as many CPUs, in vLLM's
compiled mode, with stock in the planner's dtype (`zenvllm bench --stock-dtype plan`):
the ratio is the layout's alone on every CPU kind. The floor is the lowest ratio a
recorded repeat reached less the spread of all recorded repeats (across runs and
machines), so a run as good as the recorded ones passes and a planner that lost its
advantage (about 1.0x on 2 cores) fails.

    python -m zenvllm.bench.guard OUT [--recorded docs/bench] [--config auto]

--config judges another configuration of the run as if it were the plan: CI's sabotaged
plan (auto-stock-bind, the planner's layout with stock's thread binding) must fail.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from zenvllm.core import gate
from zenvllm.image import data

PLANNER, BASELINE = "auto", "stock"
RECORDED = data.ROOT.parent.parent / "docs" / "bench"
FIX = "run `zenvllm bench --configs stock,auto` into it again"


def repeat_ratios(doc: dict, config: str = PLANNER) -> list[float]:
    """The configuration's output tok/s over stock's, repeat by repeat."""
    by = {
        (r["config"], r["repeat"]): r["output_tok_s"]
        for r in doc.get("runs", [])
        if r.get("output_tok_s", 0) > 0
    }
    repeats = sorted({rep for (name, rep) in by if name == config})
    return [by[config, n] / by[BASELINE, n] for n in repeats if (BASELINE, n) in by]


def layout_alone(meta: dict) -> bool:
    """Whether stock served the planner's dtype, so that their ratio is the layout's
    alone. On a CPU without bf16 in hardware the planner serves float32 and stock's bf16
    is emulated: the ratio would count the dtype too, and a layout that lost its
    advantage would still pass. Runs from before the bench recorded both dtypes ran on
    CPUs that compute bf16 (docs/benchmarks.md: a Xeon with AMX, Zen 4, Zen 5), where
    both served it."""
    return meta.get("stock_dtype", "bfloat16") == meta.get("plan_dtype", "bfloat16")


def comparable(doc: dict, model: str, cpus: int) -> bool:
    meta = doc.get("meta", {})
    return (
        meta.get("model") == model
        and meta.get("cpus") == cpus
        and not meta.get("workload", {}).get("enforce_eager", False)
        and not meta.get("serve_env")  # the plan as planned, not an experiment on it
        and layout_alone(meta)
    )


def floor(recorded: list[dict], model: str, cpus: int) -> tuple[float, str] | None:
    """The lowest ratio any recorded repeat reached, less the spread of all of them
    (highest minus lowest, across runs and machines); None when nothing compares."""
    runs = [r for r in (repeat_ratios(d) for d in recorded if comparable(d, model, cpus)) if r]
    pooled = [ratio for run in runs for ratio in run]
    if not pooled:
        return None
    spread = max(pooled) - min(pooled)
    basis = (
        f"{len(pooled)} recorded repeats of {model} on {cpus} CPUs in {len(runs)} run(s) "
        f"({min(pooled):.3f}x-{max(pooled):.3f}x)"
    )
    return round(min(pooled) - spread, 3), basis


def judge(doc: dict, recorded: list[dict], config: str = PLANNER) -> tuple[bool, str]:
    """Whether this run's `config` keeps the planner's recorded advantage over stock, and
    the sentence that says so."""
    meta = doc["meta"]
    if not layout_alone(meta):
        return False, (
            f"this run's stock served {meta['stock_dtype']} and the plan {meta['plan_dtype']}: "
            "its ratio counts the dtype with the layout, the recorded runs the layout alone; "
            "run `zenvllm bench --stock-dtype plan` for the guard"
        )
    ratios = repeat_ratios(doc, config)
    if not ratios:
        return False, f"no {config} and {BASELINE} figures of one run to compare; {FIX}"
    found = floor(recorded, meta["model"], meta["cpus"])
    if found is None:
        return False, (
            f"no recorded compiled-mode run of {meta['model']} on {meta['cpus']} CPUs to set "
            f"the floor from; record one in {RECORDED}"
        )
    limit, basis = found
    ratio = statistics.median(ratios)
    verdict = "holds" if ratio >= limit else "FAILED"
    return ratio >= limit, (
        f"speed guard {verdict}: {config} / {BASELINE} = {ratio:.3f}x in this run, floor "
        f"{limit:.3f}x: the lowest of {basis} less their spread"
    )


def read_result(path: Path) -> dict:
    return gate.obj(gate.read_json(path, gate.DOCUMENT, FIX), str(path), FIX)


def recorded_documents(where: Path = RECORDED) -> list[dict]:
    """The recorded generation runs (an embedding run, `meta.kind: embed`, has no
    output tokens to guard)."""
    found = [read_result(p) for p in sorted(where.glob("*/results.json"))]
    return [d for d in found if d.get("meta", {}).get("kind") != "embed"]


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
