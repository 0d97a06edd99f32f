"""The pooling model's kind of bench (an embedding model): what differs from a generating
model's.

Its preparation from the request: the flags of a generating model's bench refused, the
model's sentence-transformers pooling and longest input read, the workload (inputs of
one length in requests of a few batch sizes), its catalogue's configurations on this
host (stock vLLM with --runner pooling, the planner's plan for the pooling model,
infinity-emb). Its measurement of one configuration, servers ready: at each batch size
a warm-up and the repeats with vLLM's own `vllm bench serve` (its embedding backends),
then one sentence embedded (the runner compares each vector with stock's). Its meta
(the CPU, the peer's ONNX directory) and its checks of a result document.
bench/kinds.py puts it beside its figures.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from zenvllm.bench import bandwidth, clients, document, flags, http_client, launch, layouts, to_onnx
from zenvllm.bench.catalogue import INFINITY, POOLING_SPECS
from zenvllm.bench.layouts import MODEL_MOUNT, Configuration
from zenvllm.bench.measuring import Measured, Prepared, Settings, Stage
from zenvllm.bench.recompute import close
from zenvllm.bench.results import (
    PoolingClient,
    PoolingSummary,
    combine_batch,
    parse_pooling_result,
)
from zenvllm.bench.servers import say
from zenvllm.bench.tables import batch_row, planner_row
from zenvllm.bench.workloads import (
    POOLING_FULL,
    POOLING_QUICK,
    BatchShare,
    PoolingWorkload,
    parse_batch_sizes,
)
from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.core.model import Model
from zenvllm.core.topology import read_host

# One sentence every configuration embeds after its runs: the same model gives one vector.
PROBE = "The quick brown fox jumps over the lazy dog."
# A vector of the same model, in bfloat16 against float32: 0.9999 and up (tests/serve).
SAME_VECTOR = 0.999
# The random inputs re-tokenize to within a token or so of input_len: 2% is a lot.
TOKENS_SLACK = 0.02


# -- from the request ------------------------------------------------------------------


def workload_of(request: flags.BenchRequest) -> PoolingWorkload:
    """The default (or --quick) workload with the flags given over it: --num-prompts
    counts inputs, --warmup-prompts warm-up inputs."""
    base = POOLING_QUICK if request.quick else POOLING_FULL
    given = {
        "input_len": request.input_len,
        "inputs": request.num_prompts,
        "concurrency": request.concurrency,
        "repeats": request.repeats,
        "warmup_inputs": request.warmup_prompts,
    }
    chosen: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    w = replace(base, **chosen)
    return (
        replace(w, batch_sizes=parse_batch_sizes(request.batch_sizes)) if request.batch_sizes else w
    )


def refuse_generation_flags(request: flags.BenchRequest) -> None:
    """Flags of a generating model's bench that mean nothing for embeddings."""
    given = [
        name
        for name, value in (
            ("--output-len", request.output_len),
            ("--batch1-prompts", request.batch1_prompts),
            ("--weights", request.weights),
            ("--gateway", request.gateway_flag),
            ("--serve-env", request.serve_env),
            ("--metrics-file", request.metrics_file),
        )
        if value
    ]
    if given:
        raise UserError(f"{given[0]} is not an option of the embedding bench (--embed)")


def max_len_of(request: flags.BenchRequest, model: Model, longest: int | None) -> int:
    """The served length: --max-model-len, else the sentence-transformers model's own
    longest input (vLLM refuses more for such a model), else the config's."""
    return request.max_model_len or longest or model.max_model_len or 512


def parse_configs(text: str | None) -> list[str]:
    """--configs' names from a pooling model's catalogue (all of them by default)."""
    unknown = "{!r} is not an embedding configuration"
    return layouts.parse_configs(text, False, POOLING_SPECS, unknown)


def prepare(
    request: flags.BenchRequest, model_dir: Path, model: Model
) -> Prepared[PoolingWorkload]:
    """The served length, the workload checked against it, and the configurations
    --configs names on this host (the planner's with its plan for the pooling model)."""
    refuse_generation_flags(request)
    pooling, longest = to_onnx.sentence_transformers(model_dir)
    max_len = max_len_of(request, model, longest)
    workload = workload_of(request)
    workload.check(max_len)
    host = read_host()
    base, _, notes = bandwidth.figures(host, model, measure=False)
    names = parse_configs(request.configs)
    configs, resolved = layouts.resolve(
        names, host, model, request.base_port, max_len, base, specs=POOLING_SPECS, pooling=pooling
    )
    notes = [n for n in notes if "roofline" not in n] + resolved
    return Prepared(host, max_len, workload, configs, notes, pooling=pooling)


# -- one configuration measured ---------------------------------------------------------


def client_kind(config: Configuration) -> str:
    """Which of vLLM's client backends asks this configuration's servers."""
    return INFINITY if config.kind == INFINITY else "vllm"


def serves(config: Configuration, infinity_version: str) -> str:
    """What a configuration's servers compute, in words, for the table."""
    if config.kind == INFINITY:
        return f"infinity-emb {infinity_version}, ONNX Runtime float32 (optimised graph)"
    return f"vLLM {config.servers[0].served_dtype}, --runner pooling"


def embedding_pass(
    stage: Stage[PoolingWorkload], kind: str, shares: list[BatchShare], stem: str
) -> list[PoolingClient]:
    """One pass of the run's clients, one per endpoint, their embedding results read."""

    def args_of(i: int, result_name: str) -> list[str]:
        return launch.embedding_args(
            stage.endpoints[i][0], kind, shares[i], "/results", result_name
        )

    found = clients.run_pass(stage.pool, len(shares), args_of, stem)
    return [
        parse_pooling_result(data, str(path), path.stat().st_mtime, share.requests)
        for (path, data), share in zip(found, shares, strict=True)
    ]


def measure(config: Configuration, stage: Stage[PoolingWorkload]) -> Measured:
    """At each batch size a warm-up, then this visit's repeats, each with its own inputs;
    at its last visit, the first server's vector for PROBE."""
    w, kind, count = stage.settings.workload, client_kind(config), len(stage.endpoints)
    runs = []
    for batch in w.batch_sizes:
        if w.warmup_requests(batch):
            warm = w.repeat(0).shares(batch, count, w.warmup_requests(batch))
            embedding_pass(stage, kind, warm, f"{config.name}-b{batch}-warmup")
        for repeat in stage.visit.repeats:
            load = os.getloadavg()[0]
            mine = w.repeat(repeat).shares(batch, count)
            found = embedding_pass(stage, kind, mine, f"{config.name}-b{batch}-r{repeat}")
            run = combine_batch(config.name, batch, repeat, found, load, w.concurrency)
            runs.append(run)
            say(
                f"{stage.tag}: batch {batch} repeat {repeat}/{w.repeats}: {run.inputs_s:g} "
                f"inputs/s, {run.tokens_s:g} tokens/s, p50 {run.p50_ms:g} ms, p99 "
                f"{run.p99_ms:g} ms (load {load:.2f})"
            )
    rows = {"runs": [asdict(r) for r in runs]}
    if not stage.visit.last:  # what it serves and its vector: at its last visit
        return Measured(rows, {})
    facts = {"start": stage.started, "serves": serves(config, stage.settings.infinity_version)}
    return Measured(rows, facts, probe=vector(config))


def vector(config: Configuration) -> tuple[float, ...]:
    """The first server's vector for PROBE, through the endpoint the clients use."""
    _, endpoint = launch.EMBEDDING_BACKENDS[client_kind(config)]
    url = f"http://127.0.0.1:{config.servers[0].port}{endpoint}"
    body = {"model": MODEL_MOUNT, "input": [PROBE]}
    try:
        reply = gate.parse_json(http_client.post(url, body, 120).decode(), url, "")
        return tuple(float(x) for x in reply["data"][0]["embedding"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise RuntimeError(f"{url}: no vector for one sentence ({err})") from None


def meta(settings: Settings[PoolingWorkload]) -> dict[str, Any]:
    """What a pooling model's results say of their run beyond every run's."""
    return {
        "cpu": settings.cpu,
        "onnx_dir": str(settings.onnx_dir) if settings.onnx_dir else None,
    }


# -- its document checked ------------------------------------------------------------------


def run_problems(r: dict[str, Any], w: dict[str, Any]) -> list[str]:
    """A run that lost a request or an input, or whose rate does not follow."""
    name = f"{r['config']} batch {r['batch']} repeat {r['repeat']}"
    problems = []
    if r["failed"] or r["requests"] != w["inputs"] // r["batch"] or r["inputs"] != w["inputs"]:
        problems.append(
            f"{name}: {r['requests']} requests ({r['inputs']} inputs) completed, "
            f"{r['failed']} failed, of {w['inputs'] // r['batch']} ({w['inputs']} inputs)"
        )
    expected = w["inputs"] * w["input_len"]
    if abs(r["input_tokens"] - expected) > TOKENS_SLACK * expected:
        problems.append(f"{name}: {r['input_tokens']} input tokens, expected about {expected}")
    for key, top in (("inputs_s", "inputs"), ("tokens_s", "input_tokens")):
        rate = r[top] / r["window_s"]
        if abs(rate - r[key]) > 0.05 + 1e-4 * rate:
            problems.append(f"{name}: {key} {r[key]} is not {top} / window_s = {rate:.2f}")
    return problems


def coverage_problems(result: dict[str, Any]) -> list[str]:
    """Every configuration, every batch size, every repeat: once each."""
    w = result["meta"]["workload"]
    seen: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r in result["runs"]:
        seen[r["config"], r["batch"]].append(r["repeat"])
    return [
        f"{c['name']} batch {b}: repeats {sorted(seen[c['name'], b])}, expected 1 to {w['repeats']}"
        for c in result["configurations"]
        for b in w["batch_sizes"]
        if sorted(seen[c["name"], b]) != list(range(1, w["repeats"] + 1))
    ]


def same_inputs_problems(runs: list[dict[str, Any]]) -> list[str]:
    """Each repeat's inputs are drawn once for every configuration: the servers must
    have counted the same tokens (a server that truncated or counted otherwise differs)."""
    tokens: dict[tuple[int, int], dict[str, int]] = defaultdict(dict)
    for r in runs:
        tokens[r["batch"], r["repeat"]][r["config"]] = r["input_tokens"]
    return [
        f"batch {b} repeat {n}: the configurations counted different input tokens {counts}"
        for (b, n), counts in sorted(tokens.items())
        if len(set(counts.values())) > 1
    ]


def pooling_problems(result: dict[str, Any]) -> list[str]:
    """Every configuration ran every repeat at every batch size with every request
    answered and every input counted, each rate the quotient of the numbers beside it,
    the very same inputs sent to every configuration."""
    w = result["meta"]["workload"]
    found = coverage_problems(result)
    for r in result["runs"]:
        found += run_problems(r, w)
    return found + same_inputs_problems(result["runs"])


def pooling_derived_problems(result: dict[str, Any]) -> list[str]:
    """The summary, the planner's quotients and the best per batch size, derived again
    (raises where they cannot be); the vectors against stock's."""
    again = document.derive_pooling(result)
    problems = []
    for key in ("summary", "planner_over", "best"):
        stored, want = result.get(key), again[key]
        if isinstance(want, dict) or not isinstance(stored, list):
            same = stored == want
        else:
            same = len(stored) == len(want) and all(
                a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
                for a, b in zip(stored, want, strict=True)
            )
        if not same:
            problems.append(f"{key}: not what the runs give ({want!r})")
    return problems + vector_problems(result["configurations"])


def vector_problems(configurations: list[dict[str, Any]]) -> list[str]:
    return [
        f"{c['name']}: its vector's cosine to stock's is {c['cosine_to_stock']}, under "
        f"{SAME_VECTOR}: not the same model"
        for c in configurations
        if c.get("cosine_to_stock") is not None and c["cosine_to_stock"] < SAME_VECTOR
    ]


def pooling_table_problems(result: dict[str, Any], table: str) -> list[str]:
    """table.md shows every summary row and every quotient of the planner's."""
    wanted = [batch_row(PoolingSummary(**s)) for s in result["summary"]]
    wanted += [planner_row(r) for r in result["planner_over"]]
    return [f"table.md lacks the row {row!r}" for row in wanted if row not in table]


def pooling_judged(
    result: dict[str, Any], acceptance: bool, near_best: bool
) -> tuple[list[str], str]:
    """A consistent document says so; the planner's goals are a generating model's."""
    return [], "complete and consistent (embeddings)"
