"""The result document, pure: a run's raw figures (the runs of the throughput workload
and of batch 1, the configurations, the meta) and everything derived from them, which
the bench writes (bench/report.py) and bench/check.py derives again to compare.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from zenvllm.bench import roofline
from zenvllm.bench.layouts import Configuration, Server
from zenvllm.bench.results import Run, peer_ratios, summarize, verdict, weight_ratios


def configs_from_dicts(items: list[dict[str, Any]]) -> list[Configuration]:
    out = []
    for d in items:
        servers = tuple(
            Server(
                **{
                    **s,
                    "docker_args": tuple(s["docker_args"]),
                    "serve_args": tuple(s.get("serve_args", ())),
                }
            )
            for s in d["servers"]
        )
        out.append(
            Configuration(
                name=d["name"],
                kind=d["kind"],
                summary=d["summary"],
                target=d["target"],
                servers=servers,
                same_as=tuple(d["same_as"]),
                serve_env=tuple((k, v) for k, v in d.get("serve_env", ())),
            )
        )
    return out


def config_dict(config: Configuration, image: str | None) -> dict[str, Any]:
    d = asdict(config)
    d["servers"] = [s.to_dict() for s in config.servers]
    d["shape"] = config.shape
    d["image"] = image
    return d


def derived(
    meta: dict[str, Any],
    configs: list[Configuration],
    runs: list[Run],
    batch1: list[Run] | tuple[Run, ...] = (),
) -> dict[str, Any]:
    """Everything the document derives from its raw runs: summary rows, the verdict (the
    planner's batch-1 share too), the peers, other weights and the roofline."""
    summaries = summarize(runs, configs, batch1)
    rows = roofline.roofline(summaries, configs, meta)
    return {
        "summary": [asdict(s) for s in summaries],
        "verdict": {**verdict(summaries, configs), **roofline.batch1_verdict(rows)},
        "peers": peer_ratios(summaries, configs),
        "weights": weight_ratios(summaries, configs),
        "roofline": rows,
    }


def result_document(
    meta: dict[str, Any],
    configs: list[Configuration],
    images: dict[str, str],
    runs: list[Run],
    batch1: list[Run] | tuple[Run, ...] = (),
    facts: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`runs`: the throughput workload's repeats; `batch1`: one request at a time;
    `facts`: per configuration, what ran (backend) and how it started (start, restart)."""
    facts = facts or {}
    return {
        "meta": meta,
        "configurations": [
            config_dict(c, images.get(c.target)) | facts.get(c.name, {}) for c in configs
        ],
        "runs": [asdict(r) for r in runs],
        "batch1": [asdict(r) for r in batch1],
        **derived(meta, configs, runs, batch1),
    }


def runs_of(result: dict[str, Any]) -> tuple[list[Run], list[Run]]:
    """The raw runs of a document read back: the throughput workload's, batch 1's."""
    return [Run(**r) for r in result["runs"]], [Run(**r) for r in result.get("batch1", [])]
