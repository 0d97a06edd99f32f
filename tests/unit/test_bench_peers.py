"""The bench's peers: llama.cpp's server as its docs tune it, its token count, the image
it runs from, and the planner-against-peer table the checker verifies."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from zenvllm.bench import check, document, launch, layouts, report, results, workloads
from zenvllm.core.errors import ConfigError, UserError
from zenvllm.core.host import MIB
from zenvllm.core.model import Model
from zenvllm.core.topology import read_host
from zenvllm.image import peers, render

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
TINY = Model(name="tiny-llama", weight_bytes=2 * MIB, kv_bytes_per_token=1024, max_model_len=512)


def llamacpp(host_name: str, name: str = "llamacpp"):
    (config,), _ = layouts.resolve([name], read_host(FIXTURES / host_name), TINY, 8401, 512)
    return config


def test_llamacpp_gets_a_thread_per_physical_core_and_numa_distribute_across_nodes():
    two_sockets = read_host(FIXTURES / "epyc-9354-2s-smt")
    config = llamacpp("epyc-9354-2s-smt")
    (server,) = config.servers
    cores = len({(c.package, c.core) for c in two_sockets.cpus})
    args = list(server.serve_args)
    assert args[args.index("--threads") + 1] == str(cores)
    assert args[args.index("--threads-batch") + 1] == str(cores)
    assert args[args.index("--numa") + 1] == "distribute"
    # Every CPU in the cpuset (SMT siblings too), one thread's CPU per core.
    assert len(layouts.cpu_ids(server.cpus)) == len(two_sockets.allowed_cpus) == 2 * cores
    assert len(layouts.cpu_ids(server.omp_bind)) == cores
    assert config.shape == f"1 x {cores} threads (bf16)"


def test_one_node_needs_no_numa_option_and_q8_is_its_own_run():
    (server,) = llamacpp("test-machine-zen4-2cpu").servers
    assert "--numa" not in server.serve_args
    assert server.serve_args[:2] == ("--threads", "2")
    configs, notes = layouts.resolve(
        ["stock", "llamacpp", "llamacpp-q8"],
        read_host(FIXTURES / "test-machine-zen4-2cpu"),
        TINY,
        8401,
        512,
    )
    assert [c.name for c in configs] == ["stock", "llamacpp", "llamacpp-q8"]
    assert [c.servers[0].gguf for c in configs[1:]] == ["bf16", "q8_0"]
    assert not notes


def test_quantized_weights_skip_llama_cpps_amx_repacking_where_it_crashes():
    assert "--no-repack" in llamacpp("xeon-8480-spr-amx", "llamacpp-q8").servers[0].serve_args
    assert "--no-repack" not in llamacpp("xeon-8480-spr-amx").servers[0].serve_args
    assert "--no-repack" not in llamacpp("epyc-9654-nps4", "llamacpp-q8").servers[0].serve_args


def test_llamacpp_launch_serves_the_gguf_with_a_slot_per_request_in_flight():
    (server,) = llamacpp("vm-milan-8vcpu-avx2").servers
    spec = launch.llamacpp_launch(server, "peer:1", Path("/c/gguf/m/bf16.gguf"), 512, 16, "r1")
    argv = spec.argv
    assert argv[:3] == ["run", "--label", f"{launch.BENCH_LABEL}=r1"]
    assert f"/c/gguf/m:{launch.GGUF_MOUNT}:ro" in argv
    assert argv[argv.index("peer:1") + 1 :][:2] == ["--model", f"{launch.GGUF_MOUNT}/bf16.gguf"]
    assert argv[argv.index("--parallel") + 1] == "16"
    assert argv[argv.index("--ctx-size") + 1] == str(16 * 512)  # shared by the slots
    assert argv[argv.index("--alias") + 1] == layouts.MODEL_MOUNT  # the clients' model name
    assert "--metrics" in argv and "--cap-drop" in argv
    assert argv[argv.index("--sse-ping-interval") + 1] == "-1"  # vllm bench can't parse pings
    assert f"--cpuset-cpus={server.cpus}" in argv


def test_each_repeat_and_the_warm_up_draw_their_own_prompts():
    shares = workloads.FULL.shares(3)
    seeds = [s.repeat(r).seed for r in range(4) for s in shares]  # warm-up and 3 repeats
    assert len(set(seeds)) == len(seeds) == 12
    # The same for every configuration: repeat r asks each of them the same prompts.
    assert [s.repeat(2).seed for s in workloads.FULL.shares(3)] == [
        s.repeat(2).seed for s in shares
    ]


def test_llama_server_clients_keep_per_request_latencies_on_fresh_connections():
    share = workloads.QUICK
    plain = launch.client_args("u", "m", share, "/r", "f.json")
    assert "--save-detailed" not in plain and "--header" not in plain
    args = launch.client_args("u", "m", share, "/r", "f.json", llamacpp=True)
    assert args[-3:] == ["--save-detailed", "--header", "Connection=close"]


def client(completed=4, tokens=999):
    return results.ClientResult(
        completed=completed,
        failed=0,
        input_tokens=128 * completed,
        output_tokens=tokens,  # vllm bench's re-tokenized count
        duration_s=10.0,
        mean_ttft_ms=50.0,
        median_ttft_ms=50.0,
        mean_tpot_ms=1.0,
        median_tpot_ms=1.0,
        finished_at=100.0,
    )


def test_the_servers_count_replaces_the_re_tokenized_one_and_tpot_follows():
    # Four requests of 5 tokens: 4 gaps each, summing to 0.4, 0.8, 0.8, 1.2 s.
    data = {"itls": [[0.1] * 4, [0.2] * 4, [0.2] * 4, [0.3] * 4]}
    counted = results.counted_by_server(client(), data, "f.json", 20, 5)
    assert counted.output_tokens == 20
    assert counted.median_tpot_ms == pytest.approx(200.0)  # median of 100, 200, 200, 300
    assert counted.mean_tpot_ms == pytest.approx(200.0)
    with pytest.raises(ValueError, match=r"generated 19 tokens for 4 requests of 5 \(expected 20"):
        results.counted_by_server(client(), data, "f.json", 19, 5)
    with pytest.raises(ValueError, match="inter-token latencies"):
        results.counted_by_server(client(), {}, "f.json", 20, 5)


def summary(name, out, ttft=100.0, tpot=10.0):
    return results.Summary(
        config=name,
        shape="",
        repeats=1,
        output_tok_s=out,
        output_min=out,
        output_max=out,
        total_tok_s=2 * out,
        ttft_ms=ttft,
        ttft_min=ttft,
        ttft_max=ttft,
        tpot_ms=tpot,
        tpot_min=tpot,
        tpot_max=tpot,
        ratio=None,
    )


def sweep():
    configs, _ = layouts.resolve(
        ["stock", "auto", "zen-auto", "vllm-dp", "llamacpp", "llamacpp-q8"],
        read_host(FIXTURES / "test-machine-zen4-2cpu"),
        TINY,
        8401,
        512,
    )
    return configs


def test_near_best_ranks_the_planner_among_configurations_of_the_same_weights():
    configs = sweep()
    rows = [
        summary("stock", 100),
        summary("auto", 120, ttft=80, tpot=8),
        summary("zen-auto", 200),  # another image: measured beside, not ranked
        summary("vllm-dp", 110),
        summary("llamacpp", 125, ttft=40, tpot=16),
        summary("llamacpp-q8", 300),  # half the bytes per step: not the same weights
    ]
    v = document.verdict(rows, configs)
    assert v["best_same_weights"] == "llamacpp"
    assert v["planner_vs_best"] == round(120 / 125, 3) and v["near_best"] is True
    v = document.verdict([*rows[:4], summary("llamacpp", 130), rows[5]], configs)
    assert v["planner_vs_best"] == round(120 / 130, 3) and v["near_best"] is False
    peers_ = {r["peer"]: r for r in document.peer_ratios(rows, configs)}
    assert set(peers_) == {"stock", "vllm-dp", "llamacpp", "llamacpp-q8"}
    assert peers_["llamacpp"] == {"peer": "llamacpp", "output": 0.96, "ttft": 2.0, "tpot": 0.5}


def test_the_peers_table_is_written_and_checked(tmp_path):
    configs = sweep()
    runs = []
    for name, rate, tpot in (("stock", 100, 10), ("auto", 120, 8), ("llamacpp", 90, 12)):
        run = results.combine(
            name,
            1,
            [replace(client(completed=1, tokens=1), duration_s=1 / rate, finished_at=50.0)],
            0.1,
        )
        runs.append(replace(run, median_tpot_ms=tpot))
    workload = replace(workloads.FULL, repeats=1, num_prompts=1, output_len=1, batch1_prompts=0)
    meta = {
        "model": "tiny",
        "host": "h",
        "cpus": 8,
        "workload": workload.__dict__,
        "load_before": [0, 0, 0],
        "load_after": [0, 0, 0],
        "wall_s": 1.0,
        "notes": [],
        "failures": [],
    }
    ran = [c for c in configs if c.name in ("stock", "auto", "llamacpp")]
    doc = document.result_document(meta, ran, {}, runs)
    report.write_outputs(doc, tmp_path)
    table = (tmp_path / "table.md").read_text()
    rate = {s["config"]: s["output_tok_s"] for s in doc["summary"]}
    assert f"| llamacpp | {rate['auto'] / rate['llamacpp']:.3f}x | 1.000x | 0.667x |" in table
    assert check.check_outputs(tmp_path) == []
    broken = json.loads((tmp_path / "results.json").read_text())
    broken["peers"] = [p for p in broken["peers"] if p["peer"] != "llamacpp"]
    (tmp_path / "results.json").write_text(json.dumps(broken))
    assert "peers: no row for llamacpp" in check.check_outputs(tmp_path)


def test_peer_image_is_compiled_for_one_cpu_and_named_for_it():
    config = render.load_config()
    request = render.Request(target="llamacpp")
    zen4 = peers.cpu_key(read_host(FIXTURES / "test-machine-zen4-2cpu").flags)
    amx = peers.cpu_key(read_host(FIXTURES / "xeon-8480-spr-amx").flags)
    assert zen4 != amx
    a, b = peers.render_peer(config, request, zen4), peers.render_peer(config, request, amx)
    assert a.tag == f"zenvllm/llamacpp:{config['peers']['llamacpp']['version']}-{zen4}"
    # The key is inside the build step, so a layer compiled for another CPU is never reused.
    assert f"GGML_NATIVE for CPU {zen4}" in a.files["Dockerfile"]
    assert a.files["Dockerfile"] != b.files["Dockerfile"]
    assert config["peers"]["llamacpp"]["sha256"] in a.files["Dockerfile"]
    with pytest.raises(ConfigError, match="bench peer"):
        peers.render_peer(config, render.Request(target="llamacpp", pins={"vllm": "1"}), zen4)


def test_unknown_configuration_names_the_peers_among_the_choices():
    with pytest.raises(UserError, match="llamacpp-q8"):
        layouts.parse_configs("stock,llama", quick=False)
