"""A result document's derived figures, derived again from its raw runs and compared.

bench/check.py trusts no stored verdict: the summary rows, the verdict (acceptance,
the planner against stock, the best layout and overall, the planner against the best
that serves the same weights, its batch-1 share), the peers, the other weights and
the roofline are derived again from the runs in results.json with the bench's own
rules (bench/document.py), and every difference is a problem. A roofline share over
100% is one too: the bandwidth figure it divides by is too low.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from zenvllm.bench import document, roofline
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.results import Run, Summary

# Verdict keys a document written before the peers table lacks.
PEER_KEYS = ("best_same_weights", "planner_vs_best", "near_best_ratio", "near_best")


def close(a: object, b: object) -> bool:
    """Equal, floats to a part in 10^9 (a JSON round trip keeps them exact)."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    return a == b


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """summary, verdict, peers, weights and roofline from the document's raw runs."""
    configs: list[Configuration] = document.configs_from_dicts(result["configurations"])
    runs, batch1 = document.runs_of(result)
    return document.derived(result["meta"], configs, runs, batch1)


# Summary fields with a default that says "not known" (memory 0, no batch 1).
SILENT = {f.name: f.default for f in fields(Summary) if f.default is not MISSING}


def says_nothing(field: str, value: object) -> bool:
    return value is None or (field in SILENT and value == SILENT[field])


def row_problems(
    label: str, key: str, stored: list[dict[str, Any]], derived: list[dict[str, Any]]
) -> list[str]:
    """Rows keyed by `key`, every field derived again. A field the stored row lacks is
    fine when the derived value says nothing (None, or a default such as memory 0): a
    document written before that field existed."""
    problems = []
    have = {r[key]: r for r in stored}
    want = {r[key]: r for r in derived}
    problems += [
        f"{label}: no row for {name} (derived from its runs)" for name in want.keys() - have.keys()
    ]
    problems += [
        f"{label}: {name} has no runs to derive it from" for name in have.keys() - want.keys()
    ]
    for name in sorted(have.keys() & want.keys()):
        for field, value in want[name].items():
            if field not in have[name]:
                if not says_nothing(field, value):
                    problems.append(f"{label}: {name} lacks {field} (derived: {value})")
            elif not close(have[name][field], value):
                problems.append(
                    f"{label}: {name} {field} is {have[name][field]!r}, its runs give {value!r}"
                )
    return problems


def verdict_problems(
    stored: dict[str, Any], derived: dict[str, Any], before_peers: bool
) -> list[str]:
    problems = []
    for key, value in derived.items():
        if key not in stored:
            if not (before_peers and key in PEER_KEYS):
                problems.append(f"verdict: {key} is missing (derived: {value!r})")
        elif not close(stored[key], value):
            problems.append(f"verdict: {key} is {stored[key]!r}, the runs give {value!r}")
    problems += [
        f"verdict: {key} is not a verdict the bench gives" for key in stored.keys() - derived.keys()
    ]
    return problems


def over_problems(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """A share over 100% streams more than the cores can: the figure is wrong."""
    problems = []
    for r in rows:
        for prefix, what in (("", "the throughput workload"), ("batch1_", "batch 1")):
            if roofline.over(r.get(f"{prefix}percent")):
                problems.append(
                    f"roofline: {r['config']} at {what} streamed {r[f'{prefix}weight_gbs']} GB/s "
                    f"of weights, over its {r[f'{prefix}bandwidth_gbs']} GB/s "
                    f"({r[f'{prefix}percent']}%): the bandwidth figure is too low "
                    f"({meta.get('bandwidth_source') or 'unknown source'})"
                )
    return problems


def batch1_problems(result: dict[str, Any]) -> list[str]:
    """With batch1_prompts in the workload, every configuration that ran and has servers
    of its own made one batch-1 run of that many prompts, one at a time, every token."""
    w = result["meta"]["workload"]
    prompts = w.get("batch1_prompts", 0)
    batch1 = [Run(**r) for r in result.get("batch1", [])]
    ran = {r["config"] for r in result["runs"]}
    served = {c["name"] for c in result["configurations"] if c["servers"]} & ran
    problems = []
    if prompts:
        mine = {r.config for r in batch1}
        problems += [f"{name}: no batch-1 run" for name in sorted(served - mine)]
    elif batch1:
        problems.append(f"batch 1: {len(batch1)} runs, but the workload asks for none")
    for r in batch1:
        where = f"{r.config} batch 1"
        if r.config not in served:
            problems.append(f"{where}: not a configuration that ran with servers of its own")
        if r.concurrency != 1 or r.clients != 1:
            problems.append(f"{where}: concurrency {r.concurrency}, {r.clients} client(s), not 1")
        if r.failed or r.completed != prompts:
            problems.append(f"{where}: {r.completed} completed, {r.failed} failed of {prompts}")
        if r.output_tokens != prompts * w["output_len"]:
            problems.append(
                f"{where}: {r.output_tokens} output tokens, expected {prompts} x {w['output_len']}"
            )
        rate = r.output_tokens / r.window_s
        if abs(rate - r.output_tok_s) > 0.01 + 1e-4 * rate:
            problems.append(f"{where}: output_tok_s {r.output_tok_s} is not {rate:.2f}")
    return problems


def problems(result: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    """Every derived figure of the document against the same figure derived again
    (`derive(result)`)."""
    found = row_problems("summary", "config", result["summary"], derived["summary"])
    before_peers = "peers" not in result
    found += verdict_problems(result["verdict"], derived["verdict"], before_peers)
    if "roofline" in result or derived["roofline"]:
        found += row_problems("roofline", "config", result.get("roofline", []), derived["roofline"])
    found += over_problems(derived["roofline"], result["meta"])
    return found + batch1_problems(result)
