"""The embedding bench's pure parts (issue 45): its workload and `vllm bench serve`'s
embedding arguments, its configurations (stock vLLM with --runner pooling, the
planner's plan for the pooling model, infinity-emb as its docs run it on a CPU), the
result files folded into runs, summaries and quotients, the files and their check,
the peer's image, and the recorded run in docs/bench/embed."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from test_pooling import minilm_dir

from zenvllm.bench import (
    check,
    document,
    kinds,
    launch,
    layouts,
    pooling,
    report,
    results,
    to_onnx,
    workloads,
)
from zenvllm.bench.catalogue import POOLING_SPECS
from zenvllm.bench.results import PoolingClient
from zenvllm.bench.workloads import PoolingWorkload
from zenvllm.core.cores import usable_cores
from zenvllm.core.errors import UserError
from zenvllm.core.host import MIB
from zenvllm.core.model import POOLING, Model, read_model
from zenvllm.core.topology import read_host
from zenvllm.image import peers, render

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
RECORDED = REPO / "docs" / "bench" / "embed"


def host(name: str):
    return read_host(FIXTURES / "hosts" / name)


@pytest.fixture
def encoder(tmp_path):
    return minilm_dir(tmp_path / "minilm")


# -- the workload ------------------------------------------------------------------


def test_the_default_workload_is_128_token_inputs_in_batches_of_1_8_and_32():
    w = PoolingWorkload()
    w.check(256)
    assert (w.input_len, w.batch_sizes, w.concurrency) == (128, (1, 8, 32), 4)
    assert [w.requests(b) for b in w.batch_sizes] == [512, 64, 16]
    assert [w.warmup_requests(b) for b in w.batch_sizes] == [64, 8, 2]
    assert w.repeat(2).seed == 2000 and w.repeat(0).seed == 0


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"inputs": 100}, "not a multiple of batch size 8"),
        ({"input_len": 300}, "--input-len 300"),
        ({"input_len": 2}, "--input-len 2"),
        ({"batch_sizes": ()}, "--batch-sizes"),
        ({"concurrency": 0}, "--concurrency 0"),
    ],
)
def test_a_workload_that_cannot_run_whole_batches_is_refused(change, says):
    with pytest.raises(UserError, match=says):
        replace(PoolingWorkload(), **change).check(256)


def test_batch_sizes_are_read_once_each_and_refused_by_value():
    assert workloads.parse_batch_sizes("1,8,32,8") == (1, 8, 32)
    for bad in ("0,8", "a", "", "8192"):
        with pytest.raises(UserError, match="--batch-sizes"):
            workloads.parse_batch_sizes(bad)


def test_requests_and_concurrency_split_over_the_clients_of_a_layout():
    w = PoolingWorkload(concurrency=5)
    mine = w.shares(32, 2)
    assert [(s.requests, s.concurrency, s.inputs) for s in mine] == [(8, 3, 256), (8, 2, 256)]
    assert [s.seed for s in mine] == [0, 1]  # each client its own inputs
    with pytest.raises(UserError, match="3 instances need"):
        replace(w, concurrency=2).shares(1, 3)


def test_vllm_and_infinity_are_asked_by_vllms_own_client_at_their_endpoints():
    share = workloads.BatchShare(batch=8, requests=64, concurrency=4, input_len=128, seed=1000)
    args = launch.embedding_args("http://127.0.0.1:8901", "vllm", share, "/r", "x.json")
    assert args[:2] == ["bench", "serve"]
    pairs = dict(zip(args[2::2], args[3::2], strict=False))
    assert pairs["--backend"] == "openai-embeddings" and pairs["--endpoint"] == "/v1/embeddings"
    assert pairs["--random-batch-size"] == "8" and pairs["--num-prompts"] == "512"
    assert pairs["--max-concurrency"] == "4" and pairs["--seed"] == "1000"
    peer = launch.embedding_args("http://127.0.0.1:8901", "infinity", share, "/r", "x.json")
    assert "infinity-embeddings" in peer and "/embeddings" in peer
    assert "--save-detailed" in peer  # every request's latency and error kept


# -- the configurations -----------------------------------------------------------


def test_stock_the_planner_and_infinity_on_a_two_socket_host(encoder):
    model = read_model(encoder)
    assert model.runner == POOLING
    fixture = host("epyc-9354-2s-smt")
    names = pooling.parse_configs(None)
    configs, _ = layouts.resolve(
        names, fixture, model, 8901, 256, specs=POOLING_SPECS, pooling="mean"
    )
    stock, auto, peer = configs
    assert stock.servers[0].serve_args == ("--runner", "pooling") and stock.shape == "1 x all CPUs"
    # The planner's pooling plan: one instance per node, no KV cache.
    assert len(auto.servers) == 2 and {s.kv_cache_gib for s in auto.servers} == {0}
    assert all(s.instance and s.instance.runner == POOLING for s in auto.servers)
    args = peer.servers[0].serve_args
    assert args[args.index("--engine") + 1] == "optimum" and "--lengths-via-tokenize" in args
    assert args[args.index("--batch-size") + 1] == "32"
    assert args[args.index("--pooling-method") + 1] == "mean"
    every = {c for ids in usable_cores(fixture).values() for core in ids for c in core}
    assert set(layouts.cpu_ids(peer.servers[0].cpus)) == every  # all usable CPUs
    assert pooling.client_kind(peer) == "infinity" and pooling.client_kind(auto) == "vllm"


def test_the_configurations_are_named_and_stock_is_required():
    assert pooling.parse_configs(None) == ["stock", "auto", "infinity"]
    assert pooling.parse_configs("stock,infinity,stock") == ["stock", "infinity"]
    with pytest.raises(UserError, match="not an embedding configuration"):
        pooling.parse_configs("stock,llamacpp")
    with pytest.raises(UserError, match="include 'stock'"):
        pooling.parse_configs("auto,infinity")


def test_infinity_serves_the_onnx_directory_under_the_clients_model_name():
    server = layouts.infinity_server(host("test-machine-zen4-2cpu"), 8903, "mean")
    argv = launch.infinity_launch(server, "zenvllm/infinity:0.0.78", Path("/c/onnx/m"), "r1").argv
    assert argv[:2] == ["run", "-d"] and "--cap-drop" in argv and "/c/onnx/m:/model:ro" in argv
    tail = argv[argv.index("zenvllm/infinity:0.0.78") :]
    assert tail[:5] == [
        "zenvllm/infinity:0.0.78",
        "v2",
        "--model-id",
        "/model",
        "--served-model-name",
    ]
    assert tail[5] == layouts.MODEL_MOUNT and "8903" in tail and "io.zenvllm.bench=r1" in argv


def test_the_sentence_transformers_pooling_and_length_are_read_from_the_model(encoder):
    assert to_onnx.sentence_transformers(encoder) == ("mean", 256)
    (encoder / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_max_tokens": True})
    )
    with pytest.raises(UserError, match="neither mean nor CLS"):
        to_onnx.sentence_transformers(encoder)
    (encoder / "modules.json").unlink()
    with pytest.raises(UserError, match="no sentence-transformers Pooling module"):
        to_onnx.sentence_transformers(encoder)


# -- results ----------------------------------------------------------------------


def result_file(latencies_s: list[float], batch: int, tokens_each: int = 128, errors=None) -> dict:
    """What `vllm bench serve --save-detailed` writes for an embedding backend."""
    errors = errors or [""] * len(latencies_s)
    done = [t for t, e in zip(latencies_s, errors, strict=True) if not e]
    return {
        "backend": "openai-embeddings",
        "duration": 2.0,
        "completed": len(done),
        "total_input_tokens": len(done) * batch * tokens_each,
        "total_input_sequences": len(done) * batch,
        "input_lens": [batch * tokens_each if not e else 0 for e in errors],
        "latencies": [t if not e else 0.0 for t, e in zip(latencies_s, errors, strict=True)],
        "errors": errors,
        "median_e2el_ms": 1000 * statistics.median(done),
    }


def test_a_result_file_is_read_and_a_lost_request_counts_as_failed():
    got = results.parse_pooling_result(result_file([0.1, 0.2, 0.3, 0.4], 8), "f", 100.0, 4)
    assert (got.completed, got.failed, got.inputs, got.input_tokens) == (4, 0, 32, 4096)
    assert got.latencies_ms == (100.0, 200.0, 300.0, 400.0)
    lost = results.parse_pooling_result(
        result_file([0.1, 0.2, 0.3], 8, errors=["", "", "boom"]), "f", 1, 3
    )
    assert (lost.completed, lost.failed) == (2, 1)
    with pytest.raises(ValueError, match="not an embedding result"):
        results.parse_pooling_result({"completed": 1}, "f", 1, 1)


def test_percentiles_are_numpys_linear_ones_as_vllms_client_computes_them():
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    inclusive = statistics.quantiles(values, n=100, method="inclusive")
    for p in (50, 90, 99):
        assert results.percentile(values, p) == pytest.approx(inclusive[p - 1])
    assert results.percentile([7.0], 99) == 7.0


def client(end: float, duration: float = 2.0, latencies=(10.0, 20.0), inputs=64) -> PoolingClient:
    return PoolingClient(len(latencies), 0, inputs, inputs * 128, duration, tuple(latencies), end)


def test_clients_fold_into_one_run_over_the_span_of_all_of_them():
    run = results.combine_batch("auto", 8, 1, [client(100.0), client(101.0)], 0.5, 4)
    assert run.window_s == 3.0 and run.inputs == 128 and run.inputs_s == round(128 / 3.0, 2)
    assert run.tokens_s == round(128 * 128 / 3.0, 1) and run.clients == 2
    assert run.p50_ms == 15.0 and run.mean_ms == 15.0


def sample_runs(rates: dict[str, float]) -> list[results.PoolingRun]:
    runs = []
    for name, rate in rates.items():
        for batch in (1, 8):
            for repeat, spread in ((1, 0.98), (2, 1.02)):
                window = round(512 / (rate * batch**0.5 * spread), 4)
                latencies = tuple((40.0 + i % 7) * batch / rate for i in range(512 // batch))
                found = [client(100.0, window, latencies, inputs=512)]
                runs.append(results.combine_batch(name, batch, repeat, found, 0.1, 4))
    return runs


MINILM = Model(
    name="minilm", weight_bytes=90 * MIB, kv_bytes_per_token=None, max_model_len=256, runner=POOLING
)


def sample_configs():
    fixture = host("test-machine-zen4-2cpu")
    names = list(POOLING_SPECS)
    configs, _ = layouts.resolve(
        names, fixture, MINILM, 8901, 256, specs=POOLING_SPECS, pooling="mean"
    )
    return configs


def test_summaries_ratios_and_the_planners_quotients_follow_from_the_runs():
    configs = sample_configs()
    runs = sample_runs({"stock": 50.0, "auto": 60.0, "infinity": 40.0})
    rows = results.summarize_batches(runs, configs)
    assert [(s.config, s.batch) for s in rows][:2] == [("stock", 1), ("stock", 8)]
    by = {(s.config, s.batch): s for s in rows}
    auto = by["auto", 8]
    assert auto.inputs_s == round(
        statistics.median(r.inputs_s for r in runs if r.config == "auto" and r.batch == 8), 1
    )
    assert auto.ratio == round(auto.inputs_s / by["stock", 8].inputs_s, 3)
    over = document.planner_over(rows)
    assert [(r["other"], r["batch"]) for r in over] == [
        ("stock", 1),
        ("stock", 8),
        ("infinity", 1),
        ("infinity", 8),
    ]
    assert over[3]["inputs"] == round(auto.inputs_s / by["infinity", 8].inputs_s, 3)
    assert document.best_per_batch(rows) == {"1": "auto", "8": "auto"}


def write_sample(tmp_path: Path) -> dict:
    configs = sample_configs()
    w = PoolingWorkload(batch_sizes=(1, 8), repeats=2)
    meta = {
        "host": "AMD EPYC (Zen 4), 2 CPUs",
        "cpu": "AMD EPYC (Zen 4) (cpu family 25, model 17)",
        "cpus": 2,
        "model": "minilm",
        "workload": asdict(w),
        "load_before": [0.1, 0.1, 0.1],
        "load_after": [1.0, 1.0, 1.0],
        "wall_s": 300.0,
        "notes": [],
        "failures": [],
    }
    runs = sample_runs({"stock": 50.0, "auto": 60.0, "infinity": 40.0})
    facts = {
        c.name: {"start": {"ready_s": 30.0}, "serves": "x", "cosine_to_stock": 0.99998}
        for c in configs
    }
    result = document.pooling_document(
        meta, configs, {"vllm-openai": "v", "infinity": "i"}, runs, facts
    )
    report.write_outputs(result, tmp_path, plots=True)
    return result


def test_the_files_are_written_and_checked_as_the_runs_give_them(tmp_path):
    result = write_sample(tmp_path)
    assert result["meta"]["kind"] == "embed"
    assert check.check_outputs(tmp_path, ["stock", "auto", "infinity"]) == []
    table = (tmp_path / "table.md").read_text()
    assert "| stock | 1 x all CPUs |" in table and "| 8 | infinity |" in table
    assert check.main([str(tmp_path)]) == 0


@pytest.mark.parametrize(
    ("breaking", "says"),
    [
        (lambda d: d["runs"][0].update(failed=1), "1 failed"),
        (lambda d: d["runs"][0].update(inputs_s=1.0), "inputs_s 1.0 is not inputs / window_s"),
        (lambda d: d["runs"][1].update(input_tokens=65000), "counted different input tokens"),
        (lambda d: d["summary"][0].update(inputs_s=1.0), "summary: not what the runs give"),
        (lambda d: d["planner_over"].pop(), "planner_over: not what the runs give"),
        (lambda d: d["runs"].pop(), "expected 1 to 2"),
        (lambda d: d["configurations"][2].update(cosine_to_stock=0.5), "not the same model"),
        (lambda d: d["meta"]["failures"].append("infinity: died"), "failed: infinity: died"),
    ],
)
def test_every_inconsistency_is_a_problem(tmp_path, breaking, says):
    result = write_sample(tmp_path)
    breaking(result)
    (tmp_path / "results.json").write_text(json.dumps(result))
    found = check.check_outputs(tmp_path)
    assert any(says in p for p in found), found


# -- the peer's image ---------------------------------------------------------------


def test_the_infinity_image_is_rendered_from_build_yaml_with_the_stacks_torch(tmp_path):
    config = render.load_config()
    peer = config["peers"]["infinity"]
    assert peer["version"] == "0.0.78" and peer["publisher"] and peer["reason"]
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"w")
    ctx = peers.render_peer(config, render.Request(target="infinity", wheelhouse=tmp_path), "k")
    dockerfile = ctx.files["Dockerfile"]
    assert ctx.tag == "zenvllm/infinity:0.0.78"  # wheels only: no CPU key
    assert f"torch=={config['pins']['torch']['version']}" in dockerfile
    assert all(f'"{r}"' in dockerfile for r in peer["requirements"])
    assert "INFINITY_ENGINE=optimum" in dockerfile and "--extra-index-url" not in dockerfile
    assert set(ctx.copies) == {"wheelhouse/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"}
    assert "io.zenvllm.cpu-key" not in ctx.labels
    index = peers.render_peer(config, render.Request(target="infinity"), "k").files["Dockerfile"]
    assert config["defaults"]["torch_index_url"] in index


# -- the recorded run ----------------------------------------------------------------


@pytest.mark.skipif(not (RECORDED / "results.json").exists(), reason="no recorded embedding run")
def test_the_recorded_embedding_run_is_complete_and_consistent():
    """`make bench-embed`'s run whose figures docs/how-to/embeddings.md quotes."""
    assert check.check_outputs(RECORDED, ["stock", "auto", "infinity"]) == []
    result = json.loads((RECORDED / "results.json").read_text())
    w = result["meta"]["workload"]
    assert (w["input_len"], w["batch_sizes"]) == (128, [1, 8, 32])
    assert "cpu family" in result["meta"]["cpu"]
    assert {(r["other"], r["batch"]) for r in result["planner_over"]} == {
        (o, b) for o in ("stock", "infinity") for b in (1, 8, 32)
    }
    cosines = [c["cosine_to_stock"] for c in result["configurations"]]
    assert min(cosines) > 0.999, cosines


@pytest.mark.parametrize(
    ("name", "batch", "requests"),
    [
        ("vllm-bench-serve-0.32.0-embeddings.json", 8, 4),
        ("vllm-bench-serve-0.32.0-infinity.json", 1, 32),
    ],
)
def test_real_result_files_of_vllms_client_are_read_as_it_computed_them(name, batch, requests):
    """Files `vllm bench serve` wrote against stock vLLM (openai-embeddings, 4 requests of
    8 inputs) and infinity (infinity-embeddings, 32 of 1): our percentiles are its own."""
    data = json.loads((FIXTURES / "bench" / name).read_text())
    got = results.parse_pooling_result(data, name, 100.0, requests)
    assert (got.completed, got.failed, got.inputs) == (requests, 0, requests * batch)
    assert got.input_tokens == requests * batch * 32  # the --quick run's 32-token inputs
    for p in workloads.PERCENTILES:
        mine = results.percentile(got.latencies_ms, p)
        assert mine == pytest.approx(data[f"p{p}_e2el_ms"], rel=1e-9)
    run = results.combine_batch("x", batch, 1, [got], 0.0, 4)
    assert run.inputs_s == round(requests * batch / round(data["duration"], 4), 2)


def test_the_embedding_runs_meta_is_made_from_its_own_settings(tmp_path):
    """An embedding run's meta is every run's (run_meta) and its kind's: the dtypes are a
    generating model's (reading them as the embedding bench's failed a run at its very
    end, before the one Settings held them)."""
    from zenvllm.bench.measuring import Settings
    from zenvllm.bench.meta import run_meta

    settings = Settings(
        model_dir=tmp_path, model_name="m", images={}, workload=PoolingWorkload(),
        max_model_len=512, out_dir=tmp_path, onnx_dir=None, host_label="h",
    )  # fmt: skip
    said = {
        **run_meta(settings, "run", 0.0, (0.0, 0.0, 0.0), []),
        **kinds.POOLING_KIND.meta(settings),
    }
    assert said["model"] == "m" and "stock_dtype" not in said
