"""The bench's other copies of the weights (--weights NAME=DIR): each planned, served from
its own directory, kept out of the planner's same-weights ranking, and tabled and
checked against the planner's layout on --model's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from support.quant_model import ensure_quant_model
from support.tiny_model import ensure_tiny_model

from zenvllm.bench import (
    check,
    document,
    generation,
    launch,
    layouts,
    report,
    results,
    workloads,
)
from zenvllm.core.errors import UserError
from zenvllm.core.model import read_model
from zenvllm.core.topology import read_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
ZEN4 = read_host(FIXTURES / "test-machine-zen4-2cpu")
MILAN = read_host(FIXTURES / "vm-milan-8vcpu-avx2")


def copies(*formats: str) -> tuple[layouts.Weights, ...]:
    specs = [f"{fmt}={ensure_quant_model(fmt=fmt)}" for fmt in formats]
    return generation.weights_copies(specs, ensure_tiny_model())


def sweep(host=ZEN4, formats=("w8a8", "awq")):
    model = read_model(ensure_tiny_model())
    return layouts.resolve(["stock", "auto"], host, model, 8401, 512, None, copies(*formats))


def test_each_copy_is_the_planners_layout_served_from_its_own_directory():
    configs, notes = sweep()
    assert [c.name for c in configs] == ["stock", "auto", "auto-w8a8", "auto-awq"]
    assert not notes  # not folded into auto although placed alike
    for config, fmt in zip(configs[2:], ("w8a8", "awq"), strict=True):
        model = read_model(ensure_quant_model(fmt=fmt))
        assert all(s.model_dir == str(ensure_quant_model(fmt=fmt)) for s in config.servers)
        assert {s.weight_bytes for s in config.servers} == {model.weight_bytes}
        assert model.quantization.label in config.summary
        settings = launch.container_settings(
            "img", Path(config.servers[0].model_dir), 512, False, Path("/tmp")
        )
        argv = launch.server_launch(config.servers[0], settings, "r").argv
        assert f"{ensure_quant_model(fmt=fmt)}:{layouts.MODEL_MOUNT}:ro" in " ".join(argv)
        assert not document.same_weights(config)  # fewer bytes per step: not ranked with auto
    assert document.same_weights(configs[1])


def test_every_planner_layout_asked_for_is_planned_for_each_copy_alike_ones_once():
    model = read_model(ensure_tiny_model())
    names = ["stock", "single", "auto", "two-per-node", "zen-auto"]
    configs, notes = layouts.resolve(names, ZEN4, model, 8401, 512, None, copies("w8a8"))
    by_name = {c.name: c for c in configs}
    # Without SMT auto is one 2-core instance, single's layout, for either weights.
    assert list(by_name) == [
        "stock",
        "auto",
        "two-per-node",
        "zen-auto",
        "auto-w8a8",
        "two-per-node-w8a8",
    ]
    assert by_name["auto-w8a8"].same_as == ("single-w8a8",)
    assert by_name["auto-w8a8"].shape == "1 x 2 CPUs"
    assert by_name["two-per-node-w8a8"].shape == "2 x 1 CPU"
    assert "zen-auto-w8a8" not in " ".join(notes)  # copies run on vLLM's image only
    assert "single-w8a8: identical to auto-w8a8 on this host; measured once" in notes


def test_a_copy_this_cpu_cannot_serve_is_skipped_with_the_reason():
    configs, notes = sweep(MILAN)
    assert [c.name for c in configs] == ["stock", "auto", "auto-w8a8"]
    assert any(n.startswith("auto-awq: skipped on this host:") and "avx512f" in n for n in notes)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("int8", "give NAME=DIR"),
        ("Int8=/x", "give NAME=DIR"),
        ("int8=/nowhere", "/nowhere is not a directory"),
    ],
)
def test_a_bad_weights_option_is_refused_by_name(spec, says):
    with pytest.raises(UserError, match=says):
        generation.weights_copies([spec], ensure_tiny_model())


def test_a_copy_must_be_the_same_model_and_named_once():
    bench_shape = ensure_tiny_model(shape="bench")
    with pytest.raises(UserError, match=r"not a copy of --model tiny-llama \(hidden_size 512 vs"):
        generation.weights_copies([f"other={bench_shape}"], ensure_tiny_model())
    twice = [f"a={ensure_quant_model(fmt='awq')}", f"a={ensure_quant_model(fmt='gptq')}"]
    with pytest.raises(UserError, match="a is given twice"):
        generation.weights_copies(twice, ensure_tiny_model())


def test_a_quantized_model_leaves_the_llamacpp_peers_out_with_a_note():
    model = read_model(ensure_quant_model(fmt="awq"))
    names, notes = generation.peers_for(["stock", "auto", "llamacpp", "llamacpp-q8"], model)
    assert names == ["stock", "auto"] and len(notes) == 2 and "AWQ INT4" in notes[0]
    bf16 = read_model(ensure_tiny_model())
    assert generation.peers_for(["stock", "llamacpp"], bf16) == (["stock", "llamacpp"], [])


def test_docker_stats_memory_is_summed_in_mib():
    assert results.memory_mib("1.5GiB / 4GiB\n512MiB / 4GiB\n") == 2048
    assert results.memory_mib("2048KiB / 1GiB") == 2
    with pytest.raises(ValueError, match="not a memory usage"):
        results.memory_mib("-- / --")


def test_the_weights_table_is_written_and_checked(tmp_path):
    configs, _ = sweep(formats=("w8a8",))
    runs = []
    for name, rate, tpot, mib in (
        ("stock", 100, 10, 3000),
        ("auto", 120, 8, 2000),
        ("auto-w8a8", 180, 5, 1500),
    ):
        client = results.ClientResult(1, 0, 1, 1, 1 / rate, 50.0, 50.0, 1.0, 1.0, 50.0)
        run = results.combine(name, 1, [client], 0.1, mib)
        runs.append(replace(run, median_tpot_ms=tpot))
    meta = {
        "model": "tiny",
        "host": "h",
        "cpus": 2,
        "load_before": [0, 0, 0],
        "load_after": [0, 0, 0],
        "wall_s": 1.0,
        "notes": [],
        "failures": [],
        "workload": replace(
            workloads.FULL, repeats=1, num_prompts=1, output_len=1, batch1_prompts=0
        ).__dict__,
    }
    doc = document.result_document(meta, configs, {}, runs)
    (row,) = doc["weights"]
    rate = {s["config"]: s["output_tok_s"] for s in doc["summary"]}
    output = round(rate["auto-w8a8"] / rate["auto"], 3)  # ~1.5, as the clients' rates round
    assert row == {
        "weights": "auto-w8a8",
        "output": output,
        "ttft": 1.0,
        "tpot": 0.625,
        "memory": 0.75,
    }
    report.write_outputs(doc, tmp_path)
    table = (tmp_path / "table.md").read_text()
    assert f"| auto-w8a8 | {output:.3f}x | 1.000x | 0.625x | 0.750x |" in table
    assert check.check_outputs(tmp_path) == []
    broken = json.loads((tmp_path / "results.json").read_text())
    broken["weights"][0]["memory"] = 0.5
    (tmp_path / "results.json").write_text(json.dumps(broken))
    assert "weights: auto-w8a8 memory 0.5 is not 1500 / 2000" in check.check_outputs(tmp_path)
    broken["weights"] = []
    (tmp_path / "results.json").write_text(json.dumps(broken))
    assert "weights: no row for auto-w8a8" in check.check_outputs(tmp_path)
