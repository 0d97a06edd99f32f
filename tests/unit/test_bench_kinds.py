"""One bench for every model kind (issue 64): a generating model and an embedding model
picked by what the model is (or --embed), prepared by their kind, run through the one
runner into the one result format, written by the one report and passed by the one
check. The engine, the clients and the servers' answers are fakes here (the bench tier
runs them for real); everything between them is the bench's own code."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest
from support.tiny_model import ensure_tiny_model
from test_pooling import minilm_dir

from zenvllm.bench import (
    backend,
    check,
    clients,
    commands_bench,
    http_client,
    kinds,
    layouts,
    leftovers,
    order,
    runner,
    servers,
    workloads,
)
from zenvllm.bench.catalogue import POOLING_SPECS
from zenvllm.bench.measuring import Settings
from zenvllm.core.errors import UserError
from zenvllm.core.host import MIB
from zenvllm.core.model import POOLING, Model, read_model
from zenvllm.core.topology import read_host

HOST = read_host(
    Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "test-machine-zen4-2cpu"
)
TINY = Model(name="tiny-llama", weight_bytes=2 * MIB, kv_bytes_per_token=1024, max_model_len=512)
MINILM = Model(
    name="minilm", weight_bytes=90 * MIB, kv_bytes_per_token=None, max_model_len=256, runner=POOLING
)


@pytest.fixture
def encoder(tmp_path):
    return minilm_dir(tmp_path / "minilm")


# -- which kind ---------------------------------------------------------------------


def test_a_model_is_benched_as_the_kind_its_runner_names(encoder):
    pooling_model = read_model(encoder)
    assert kinds.of_model(pooling_model, False, encoder) is kinds.POOLING_KIND
    assert kinds.of_model(pooling_model, True, encoder) is kinds.POOLING_KIND
    tiny = ensure_tiny_model()
    assert kinds.of_model(read_model(tiny), False, tiny) is kinds.GENERATION_KIND
    with pytest.raises(UserError, match="is not an embedding model"):
        kinds.of_model(read_model(tiny), True, tiny)


def test_a_document_names_its_kind_and_one_without_is_a_generating_models():
    assert kinds.of_document({"meta": {}}) is kinds.GENERATION_KIND
    assert kinds.of_document({"meta": {"kind": "generation"}}) is kinds.GENERATION_KIND
    assert kinds.of_document({"meta": {"kind": "embed"}}) is kinds.POOLING_KIND
    with pytest.raises(UserError, match="none of the bench's kinds"):
        kinds.of_document({"meta": {"kind": "rerank"}})


# -- the one command: --dry-run prints what each kind would run -------------------------


def dry_run(capsys, tmp_path: Path, *argv: str) -> dict:
    parser = argparse.ArgumentParser()
    commands_bench.register(parser.add_subparsers())
    args = parser.parse_args(["bench", *argv, "--dry-run", "--out", str(tmp_path / "out")])
    assert commands_bench.run(args) == 0
    assert not (tmp_path / "out").exists()  # nothing measured, nothing written
    return json.loads(capsys.readouterr().out)


def test_one_command_prepares_an_embedding_model_without_embed(capsys, tmp_path, encoder):
    plan = dry_run(capsys, tmp_path, "--model", str(encoder), "--quick")
    by_name = {c["name"]: c for c in plan["configurations"]}
    assert list(by_name) == ["stock", "auto", "infinity"]
    assert by_name["stock"]["servers"][0]["serve_args"] == ["--runner", "pooling"]
    assert by_name["infinity"]["image"].startswith("zenvllm/infinity:")
    assert plan["workload"]["batch_sizes"] == list(workloads.POOLING_QUICK.batch_sizes)
    with pytest.raises(UserError, match="--output-len is not an option of the embedding"):
        dry_run(capsys, tmp_path, "--model", str(encoder), "--output-len", "8")


def test_one_command_prepares_a_generating_model(capsys, tmp_path):
    plan = dry_run(capsys, tmp_path, "--model", str(ensure_tiny_model()), "--configs", "stock,auto")
    # the float32 quality reference first, scored only
    assert [c["name"] for c in plan["configurations"]][:2] == ["reference-f32", "stock"]
    assert plan["configurations"][0]["servers"][0]["dtype"] == "float32"
    assert "batch_sizes" not in plan["workload"]
    assert plan["workload"]["output_len"] == workloads.FULL.output_len


# -- the one runner, with a fake engine and fake clients ----------------------------------


def opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


class FakePool:
    """The run's clients: each pass writes the result file `vllm bench serve` would."""

    passes: ClassVar[list[list[str]]] = []  # every pass's arguments, in order
    fast = ""  # the configuration whose passes take half the time (the fastest)

    def __init__(self, setup: clients.Clients) -> None:
        self.clients = setup

    def ask(self, index: int, argv: list[str], log: str) -> None:
        FakePool.passes.append(argv)
        stem = opt(argv, "--result-filename")
        n, length = int(opt(argv, "--num-prompts")), int(opt(argv, "--random-input-len"))
        if "--random-batch-size" in argv:  # an embedding backend's
            batch = int(opt(argv, "--random-batch-size"))
            requests = n // batch
            data = {
                "completed": requests,
                "total_input_tokens": n * length,
                "total_input_sequences": n,
                "duration": 1.0,
                "latencies": [0.01 * (1 + i % 3) for i in range(requests)],
                "errors": [""] * requests,
            }
        else:
            data = {
                "completed": n,
                "total_input_tokens": n * length,
                "total_output_tokens": n * int(opt(argv, "--random-output-len")),
                "duration": 0.5 if FakePool.fast and stem.startswith(FakePool.fast) else 1.0,
                **{f"{a}_{m}_ms": 10.0 for a in ("mean", "median") for m in ("ttft", "tpot")},
            }
        (self.clients.result_dir / opt(argv, "--result-filename")).write_text(json.dumps(data))

    def answer(self, index: int, deadline: float) -> int:
        return 0

    def close(self) -> None:
        pass


class FakeEngine:
    """What the runner asks of docker: every container runs, answers and is removed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.live: set[str] = set()  # the containers running now

    def run(self, *args: str, **_: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        if args[0] == "run":
            named = [a.partition("=")[2] for a in args if a.startswith("--name=")]
            self.live.add(named[0] if named else opt(list(args), "--name"))
        elif args[:2] == ("rm", "-f"):
            self.live.discard(args[2])
        if args[0] == "inspect":  # a container removed is no longer found
            found = args[-1] in self.live
            out = "running" if found and "{{.State.Status}}" in args else args[-1] * found
            return subprocess.CompletedProcess(list(args), 0 if found else 1, out, "")
        out = {"logs": "a server's log", "ps": ""}.get(args[0], "")
        if args[0] == "stats":
            out = "\n".join("100MiB / 1GiB" for _ in args[4:])
        return subprocess.CompletedProcess(list(args), 0, out, "")


@pytest.fixture
def engine(monkeypatch) -> FakeEngine:
    return fake_engine(monkeypatch)


def fake_engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    """The fakes in place of docker, the clients and the servers' HTTP answers."""
    fake = FakeEngine()
    FakePool.passes, FakePool.fast = [], ""
    monkeypatch.setattr(servers, "DOCKER", fake)
    monkeypatch.setattr(servers, "healthy", lambda port: True)
    monkeypatch.setattr(servers, "port_in_use", lambda port: False)
    monkeypatch.setattr(servers.os, "chown", lambda *args: None)
    monkeypatch.setattr(clients, "ClientPool", FakePool)
    monkeypatch.setattr(leftovers, "found", set)  # never another process's files
    monkeypatch.setattr(leftovers, "clean", lambda before: [])
    monkeypatch.setattr(backend, "facts", lambda c, raw, started, *rest: {"start": started})
    monkeypatch.setattr(http_client, "post", FakeServers(fake))
    return fake


class FakeServers:
    """What every server answers: a pooling model's vector; a generating model's vLLM
    /tokenize, prompt logprobs (echo) and greedy token ids. A sabotaged server (a running
    container whose name holds `sabotaged`) gives every token 15% more perplexity and
    other greedy tokens from the 8th on: a kernel that returns wrong numbers."""

    sabotaged = ""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        FakeServers.sabotaged = ""

    def wrong(self) -> bool:
        return bool(self.sabotaged) and any(self.sabotaged in n for n in self.engine.live)

    def __call__(self, url: str, body: dict, timeout: float = 300) -> bytes:
        if url.endswith("/tokenize"):
            return json.dumps(
                {"tokens": [len(w) * 7 % 50 for w in body["prompt"].split()]}
            ).encode()
        if not url.endswith("/v1/completions"):
            return json.dumps({"data": [{"embedding": [0.1, 0.2, 0.3]}]}).encode()
        if body.get("echo"):
            off = math.log(1.15) if self.wrong() else 0.0
            lps = [None] + [-(1.0 + (i % 5) * 0.1) - off for i in body["prompt"][1:]]
            return json.dumps(
                {"choices": [{"logprobs": {"token_logprobs": [*lps, -0.5]}}]}
            ).encode()
        ids = [
            (7 * i + (3 if self.wrong() and i >= 8 else 0)) % 50 for i in range(body["max_tokens"])
        ]
        tokens = [f"token_id:{i}" for i in ids]
        return json.dumps({"choices": [{"logprobs": {"tokens": tokens}}]}).encode()


def removed(fake: FakeEngine) -> set[str]:
    return {c[2] for c in fake.calls if c[:2] == ("rm", "-f")}


def test_one_runner_runs_a_generating_and_an_embedding_model(engine, tmp_path):
    names = ["stock", "auto"]
    configs, _ = layouts.resolve(names, HOST, TINY, 8401, 512)
    settings = Settings(
        model_dir=tmp_path, model_name="tiny", images={"vllm-openai": "v"},
        workload=workloads.QUICK, max_model_len=512, out_dir=tmp_path / "gen", plots=True,
    )  # fmt: skip
    result, status = runner.run_bench(kinds.GENERATION_KIND, configs, settings)
    assert status == 0 and result["meta"]["kind"] == "generation"
    assert check.check_outputs(tmp_path / "gen", names) == []
    assert {r["config"] for r in result["batch1"]} == set(names)
    assert (tmp_path / "gen" / "raw" / "auto-r1-client0.json").is_file()
    assert removed(engine) >= {s.name for c in configs for s in c.servers}

    pooling_names = list(POOLING_SPECS)
    configs, _ = layouts.resolve(
        pooling_names, HOST, MINILM, 8901, 256, specs=POOLING_SPECS, pooling="mean"
    )
    settings = Settings(
        model_dir=tmp_path, model_name="minilm", images={"vllm-openai": "v", "infinity": "i"},
        workload=workloads.POOLING_QUICK, max_model_len=256, out_dir=tmp_path / "embed",
        onnx_dir=tmp_path, cpu="a CPU", plots=True,
    )  # fmt: skip
    result, status = runner.run_bench(kinds.POOLING_KIND, configs, settings)
    assert status == 0 and result["meta"]["kind"] == "embed"
    assert check.check_outputs(tmp_path / "embed", pooling_names) == []
    assert [c["cosine_to_stock"] for c in result["configurations"]] == [1.0, 1.0, 1.0]
    assert (tmp_path / "embed" / "raw" / "infinity-b8-r1-client0.json").is_file()
    infinity = [p for p in FakePool.passes if "infinity-embeddings" in p]
    assert infinity and all(opt(p, "--endpoint") == "/embeddings" for p in infinity)
    assert removed(engine) >= {s.name for c in configs for s in c.servers}


@pytest.mark.parametrize("reverse", [False, True])
def test_in_rounds_each_repeat_is_a_round_the_order_reversed_each_round(engine, tmp_path, reverse):
    """--order rounds: repeat r of every configuration in round r, the order reversed each
    round (ABBA), the servers started again each round, batch 1 once at each one's last
    visit; the rounds recorded, each ratio's spread over stock's repeat of the same round,
    shown in the table and passed by the check. --reverse starts from the last."""
    names = ["stock", "auto"]
    configs, _ = layouts.resolve(names, HOST, TINY, 8401, 512)
    settings = Settings(
        model_dir=tmp_path, model_name="tiny", images={"vllm-openai": "v"},
        workload=replace(workloads.QUICK, repeats=3), max_model_len=512,
        out_dir=tmp_path / "gen", plots=True, ordering=order.Order(order.ROUNDS, reverse),
    )  # fmt: skip
    FakePool.fast = "auto"  # half the duration: twice stock's tokens/s in every round
    result, status = runner.run_bench(kinds.GENERATION_KIND, configs, settings)
    assert status == 0 and check.check_outputs(tmp_path / "gen", names) == []
    first, second = (names[::-1], names) if reverse else (names, names[::-1])
    assert result["meta"]["order"] == {"mode": "rounds", "rounds": [first, second, first]}
    stems = [opt(p, "--result-filename").rsplit("-client", 1)[0] for p in FakePool.passes]
    measured = [s for s in stems if "-r" in s]
    expected = [f"{n}-r{r}" for r, given in enumerate((first, second, first), 1) for n in given]
    assert measured == expected
    for name in names:  # batch 1 after its last repeat, once
        assert stems.count(f"{name}-batch1") == 1
        assert stems.index(f"{name}-batch1") > stems.index(f"{name}-r3")
    started = [c for c in engine.calls if c[0] == "run"]
    assert len(started) == 3 * sum(len(c.servers) for c in configs)  # once a round
    auto = next(s for s in result["summary"] if s["config"] == "auto")
    assert (auto["ratio"], auto["ratio_min"], auto["ratio_max"]) == (2.0, 2.0, 2.0)
    table = (tmp_path / "gen" / "table.md").read_text()
    assert "| 2.000x (2.000-2.000) |" in table


@pytest.mark.parametrize("cache", ["cold", "warm", "stock eager"])
def test_in_rounds_a_cold_compile_cache_is_filled_before_the_first_round(
    engine, tmp_path, monkeypatch, cache
):
    """Compiled, in rounds: each configuration whose compile cache is cold (an empty
    --compile-cache here) is started once before the first round and stopped, unmeasured,
    its log kept apart; one whose cache is warm is not, nor one whose servers ask
    --enforce-eager of their own (they fill no cache). The measured rounds are as before."""
    if cache == "warm":
        monkeypatch.setattr(backend, "cache_state", lambda dirs: "warm")
    names = ["stock", "auto"]
    configs, _ = layouts.resolve(names, HOST, TINY, 8401, 512)
    if cache == "stock eager":
        eager = [
            replace(s, serve_args=(*s.serve_args, "--enforce-eager")) for s in configs[0].servers
        ]
        configs[0] = replace(configs[0], servers=tuple(eager))
    settings = Settings(
        model_dir=tmp_path, model_name="tiny", images={"vllm-openai": "v"},
        workload=replace(workloads.QUICK, repeats=2, enforce_eager=False), max_model_len=512,
        out_dir=tmp_path / "gen", plots=True, ordering=order.Order(order.ROUNDS),
        compile_cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    result, status = runner.run_bench(kinds.GENERATION_KIND, configs, settings)
    assert status == 0 and check.check_outputs(tmp_path / "gen", names) == []
    assert result["meta"]["order"]["rounds"] == [names, names[::-1]]  # what was measured
    servers_per_round = sum(len(c.servers) for c in configs)
    started = [c for c in engine.calls if c[0] == "run"]
    compiling = {"cold": configs, "warm": [], "stock eager": configs[1:]}[cache]
    first = sum(len(c.servers) for c in compiling)
    assert len(started) == first + 2 * servers_per_round
    raw = tmp_path / "gen" / "raw"
    compiled_first = sorted(p.name for p in raw.glob("*-compile-*.log"))
    assert compiled_first == sorted(
        f"{c.name}-compile-{s.name}.log" for c in compiling for s in c.servers
    )
    stems = [opt(p, "--result-filename").rsplit("-client", 1)[0] for p in FakePool.passes]
    assert [x for x in stems if "-r" in x] == ["stock-r1", "auto-r1", "auto-r2", "stock-r2"]


def test_a_configuration_that_fails_is_a_failure_and_the_others_still_run(
    engine, monkeypatch, tmp_path
):
    configs, _ = layouts.resolve(
        list(POOLING_SPECS), HOST, MINILM, 8901, 256, specs=POOLING_SPECS, pooling="mean"
    )
    settings = Settings(
        model_dir=tmp_path, model_name="minilm", images={"vllm-openai": "v", "infinity": "i"},
        workload=workloads.POOLING_QUICK, max_model_len=256, out_dir=tmp_path / "embed",
        onnx_dir=tmp_path, plots=False,
    )  # fmt: skip
    answer = http_client.post

    def no_vector_from_infinity(url: str, body: object, timeout: float) -> bytes:
        if url.endswith(":8901/embeddings"):
            raise OSError("connection refused")
        return answer(url, body, timeout)

    monkeypatch.setattr(http_client, "post", no_vector_from_infinity)
    result, status = runner.run_bench(kinds.POOLING_KIND, configs, settings)
    assert status == 1
    assert result["meta"]["failures"][0].startswith("infinity: http://127.0.0.1:8901/embeddings")
    assert {r["config"] for r in result["runs"]} == {"stock", "auto"}
    assert removed(engine) >= {s.name for c in configs for s in c.servers}  # infinity's too


def test_a_container_still_starting_is_removed_when_asked_again(monkeypatch):
    """An interrupted run leaves the engine starting its first server, and `rm -f` of a
    container still starting fails: the runner asks again until it is gone."""
    fake = fake_engine(monkeypatch)
    fake.live.add("zenvllm-bench-stock-8401")
    refusals = iter([True, True])  # the first two asks find it still starting
    plain_run = fake.run

    def run(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        if args[:2] == ("rm", "-f") and next(refusals, False):
            return subprocess.CompletedProcess(list(args), 1, "", "container is starting")
        return plain_run(*args, **kw)

    monkeypatch.setattr(fake, "run", run)
    monkeypatch.setattr(servers.time, "sleep", lambda s: None)
    servers.remove("zenvllm-bench-stock-8401")
    assert fake.live == set()
    assert [c for c in fake.calls if c[0] == "rm"] == [("rm", "-f", "zenvllm-bench-stock-8401")]
