"""Quantized models: sized exactly, named in the plan, refused where vLLM cannot serve them."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support import quant_model
from support.cli import zenvllm
from support.quant_model import ensure_quant_model
from support.tiny_model import ensure_tiny_model, made_here

from zenvllm.core.model import read_model
from zenvllm.core.quantization import read

REPO = Path(__file__).resolve().parents[2]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
ITEM_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I8": 1}


def header(path: Path) -> dict:
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def tensor_bytes(path: Path) -> int:
    """Every tensor's size from its dtype and shape (not from the offsets the planner reads)."""
    return sum(
        ITEM_BYTES[t["dtype"]] * int(np.prod(t["shape"]))
        for name, t in header(path).items()
        if name != "__metadata__"
    )


def plan(*args: str) -> subprocess.CompletedProcess:
    return zenvllm("plan", *args, env={"PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("fmt", quant_model.FORMATS)
def test_the_planner_counts_every_quantized_tensor_byte(fmt):
    model_dir = ensure_quant_model(fmt=fmt)
    tensors = header(model_dir / "model.safetensors")
    packed = {"awq": "qweight", "gptq": "qweight", "w8a8": "weight"}[fmt]
    q_proj = tensors[f"model.layers.0.self_attn.q_proj.{packed}"]
    assert q_proj["dtype"] == {"awq": "I32", "gptq": "I32", "w8a8": "I8"}[fmt]
    assert read_model(model_dir).weight_bytes == tensor_bytes(model_dir / "model.safetensors")
    bf16 = read_model(model_dir.parent / quant_model.SHAPES["tiny"].name).weight_bytes
    assert read_model(model_dir).weight_bytes < bf16  # the linears shrank, the rest stayed


@pytest.mark.parametrize(
    ("fmt", "label", "needs"),
    [
        ("awq", "AWQ INT4 (group 128)", ("avx512f",)),
        ("gptq", "GPTQ INT4 (group 128)", ("avx512f",)),
        ("w8a8", "compressed-tensors W8A8 INT8", ()),
    ],
)
def test_each_format_is_named_from_its_config(fmt, label, needs):
    q = read_model(ensure_quant_model(fmt=fmt)).quantization
    assert q is not None and (q.label, q.needs_flags) == (label, needs)
    assert q.zentorch == (fmt == "w8a8")  # dynamic per-token W8A8 only


@pytest.mark.parametrize("fmt", quant_model.FORMATS)
def test_an_avx512_host_plans_each_format_and_names_it(fmt):
    done = plan(
        "--json",
        "--root",
        str(HOSTS / "epyc-9654-nps4"),
        "--target",
        "zen",
        "--model",
        str(ensure_quant_model(fmt=fmt)),
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    label = out["model"]["quantization"]
    assert any(n.startswith(f"weights: {label};") for n in out["notes"])
    zen = "zentorch runs these linears" if fmt == "w8a8" else "zentorch has no kernel"
    assert any(zen in n for n in out["notes"])


@pytest.mark.parametrize(("fmt", "refused"), [("awq", True), ("gptq", True), ("w8a8", False)])
def test_an_avx2_host_refuses_int4_with_the_way_out(fmt, refused):
    model_dir = ensure_quant_model(fmt=fmt)
    done = plan("--root", str(HOSTS / "vm-milan-8vcpu-avx2"), "--model", str(model_dir))
    assert (done.returncode == 2) == refused, done.stderr
    if refused:
        assert done.stdout == ""
        assert "INT4 (group 128) needs avx512f, which this CPU" in done.stderr
        assert "cpu_gemm_wna16" in done.stderr and "W8A8 INT8 copy" in done.stderr


@pytest.mark.parametrize(
    ("config", "label"),
    [
        ({}, None),
        ({"quantization_config": {"quant_method": "fp8"}}, "fp8 (not tested by zenvllm"),
        (
            {
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
                }
            },
            "compressed-tensors W4A16 INT4",
        ),
    ],
)
def test_other_configs_are_named_not_judged(config, label):
    q = read(config, "config.json")
    assert (q.label[: len(label)] if q else None) == label
    assert q is None or q.needs_flags == ()


@pytest.mark.parametrize("value", ["awq", [], {"bits": 4}])
def test_a_malformed_quantization_config_is_refused_by_name(tmp_path, value):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    base = ensure_quant_model(fmt="awq")
    (model_dir / "model.safetensors").symlink_to(base / "model.safetensors")
    cfg = {**json.loads((base / "config.json").read_text()), "quantization_config": value}
    (model_dir / "config.json").write_text(json.dumps(cfg))
    done = plan("--model", str(model_dir))
    assert done.returncode == 2
    assert f"--model {model_dir}: config.json: quantization_config must be" in done.stderr


def test_the_model_makers_never_replace_a_directory_they_did_not_write(tmp_path):
    mine = tmp_path / "tiny-llama"  # where a quantized copy beside it puts its bf16 base
    mine.mkdir()
    (mine / "notes.txt").write_text("the operator's\n")
    link = tmp_path / "linked"
    link.symlink_to(mine)
    for make in (
        lambda: ensure_tiny_model(mine),
        lambda: ensure_quant_model(tmp_path / "tiny-llama-awq", fmt="awq"),
        lambda: ensure_tiny_model(link),
    ):
        with pytest.raises(SystemExit, match="is not a model tests/support made"):
            make()
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and link.is_symlink()
    assert not (tmp_path / "tiny-llama-awq").exists()
    made = ensure_quant_model(tmp_path / "other" / "tiny-llama-awq", fmt="awq")
    assert made_here(made) and made_here(made.parent / "tiny-llama")
