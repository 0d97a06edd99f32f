"""The serving dtype follows the silicon: bf16 where the CPU computes it, float32 elsewhere,
and every size in the plan is of the model as served."""

from __future__ import annotations

import json

import pytest
from support import cpu
from support.tiny_model import ensure_tiny_model

from zenvllm.core import plan_doc
from zenvllm.core.dtype import EMULATED_BF16_SLOWDOWN, native_bf16, served_model, serving_dtype
from zenvllm.core.errors import PlanError
from zenvllm.core.flavors import PRESETS, synthetic_host
from zenvllm.core.host import GIB, MIB
from zenvllm.core.model import Model, model_of_size, read_model
from zenvllm.core.plan import Policy, make_plan
from zenvllm.core.topology import read_host
from zenvllm.runtime import launcher

MILAN, GENOA = "epyc-7763-8c-32g", "epyc-9454-24c-96g"


def test_a_bf16_model_on_zen3_is_planned_in_float32_with_four_byte_weights():
    model = Model("m", weight_bytes=4 * GIB, kv_bytes_per_token=1024, max_model_len=512)
    plan = make_plan(synthetic_host(MILAN), model)
    assert plan.model.dtype == "float32"
    assert plan.model.weight_bytes == 8 * GIB
    assert plan.model.kv_bytes_per_token == 2048
    assert {i.dtype for i in plan.instances} == {"float32"}
    note = next(n for n in plan.notes if n.startswith("dtype float32"))
    assert "avx512_bf16 nor amx_bf16" in note and "8.00 GiB so (4.00 GiB stored" in note
    inst = plan.instances[0]
    limit_without_kv = inst.memory_limit_mib * MIB - inst.kv_cache_gib * GIB
    assert limit_without_kv == pytest.approx((8 + 2.5 + 1) * GIB, abs=MIB)


def test_the_same_model_on_zen4_stays_bfloat16():
    model = model_of_size(4)
    plan = make_plan(synthetic_host(GENOA), model)
    assert (plan.model.dtype, plan.model.weight_bytes) == ("bfloat16", 4 * GIB)
    assert any(n.startswith("dtype bfloat16: AMD EPYC 9454") for n in plan.notes)
    assert plan_doc.one(plan)["model"]["dtype"] == "bfloat16"
    container = plan_doc.one(plan)["instances"][0]["container"]
    assert "--dtype=bfloat16" in container["command"]


def test_the_operator_can_force_a_dtype():
    plan = make_plan(synthetic_host(MILAN), model_of_size(1), Policy(dtype="bfloat16"))
    assert plan.model.dtype == "bfloat16" and plan.model.weight_bytes == GIB
    assert "dtype bfloat16: asked for by the operator" in plan.notes
    plan = make_plan(synthetic_host(GENOA), model_of_size(1), Policy(dtype="float32"))
    assert plan.instances[0].dtype == "float32" and plan.model.weight_bytes == 2 * GIB


def test_a_float32_refusal_on_avx2_names_bfloat16_with_both_sizes_and_its_speed():
    """16 GiB stored in bf16 is 32 GiB in float32, over a 32 GiB Zen 3 VM: the refusal
    keeps float32's numbers and --hosts 2, and names bfloat16's fit and its cost."""
    with pytest.raises(PlanError) as refused:
        make_plan(synthetic_host(MILAN), model_of_size(16))
    said = str(refused.value)
    assert "weights 32.0 GiB" in said and "--hosts 2" in said, said
    half = make_plan(synthetic_host(MILAN), model_of_size(16), Policy(dtype="bfloat16"))
    kv = half.instances[0].kv_cache_gib
    assert f"--dtype bfloat16): it fits, 16.0 GiB of weights and KV {kv} GiB" in said, said
    assert f"{EMULATED_BF16_SLOWDOWN:g}x slower than float32" in said, said


@pytest.mark.parametrize(
    ("flavor", "size", "policy"),
    [
        (GENOA, 200, Policy()),  # native bf16: float32 was never the planner's choice
        (MILAN, 16, Policy(dtype="float32")),  # the operator's own float32
        (MILAN, 40, Policy()),  # bfloat16 does not fit either
    ],
)
def test_a_refusal_names_bfloat16_only_where_it_is_a_way_out(flavor, size, policy):
    with pytest.raises(PlanError) as refused:
        make_plan(synthetic_host(flavor), model_of_size(size), policy)
    assert "--dtype bfloat16" not in str(refused.value), refused.value


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_gets_the_dtype_its_flags_compute(preset):
    host = synthetic_host(preset)
    expected = "bfloat16" if {"avx512_bf16", "amx_bf16"} & host.flags else "float32"
    assert serving_dtype(host).dtype == expected


def test_a_model_twice_the_size_in_float32_can_be_refused_where_bf16_fits():
    # 24 GiB of bf16 weights are 48 GiB as float32: more than a 48 GiB Zen 3 host's
    # 46 GiB usable, which holds them as bf16.
    host = synthetic_host("vcpus=16,ram_gib=48,cpu=milan")
    with pytest.raises(PlanError, match=r"weights 48\.0 GiB"):
        make_plan(host, model_of_size(24))
    assert make_plan(host, model_of_size(24), Policy(dtype="bfloat16")).instances


def test_quantized_weights_keep_their_integers_and_only_floats_double():
    q = Model("q", weight_bytes=3 * GIB, float_bytes=GIB, kv_bytes_per_token=100)
    served = served_model(q, "float32")
    assert served.weight_bytes == 4 * GIB and served.float_bytes == 2 * GIB
    assert served.kv_bytes_per_token == 200


def test_read_model_counts_the_floating_tensors_of_the_tiny_model():
    model = read_model(ensure_tiny_model())
    assert model.dtype == "bfloat16"
    assert model.float_bytes == model.weight_bytes  # every tensor is BF16


def test_the_launcher_adds_the_native_dtype_and_keeps_an_explicit_one(fixtures_dir, monkeypatch):
    lines = []
    monkeypatch.setattr(launcher, "log", lines.append)
    monkeypatch.setattr(launcher, "shm_free", lambda path="/dev/shm": 1 << 30)
    milan = read_host(fixtures_dir / "vm-milan-8vcpu-avx2")
    argv = launcher.prepare(["--model", "/m"], {"LD_PRELOAD": ""}, milan, {})
    assert "--dtype=float32" in argv
    # The plan says why, as its own choice, not as the operator's.
    assert any(ln.startswith("plan: dtype float32: AMD EPYC 7763") for ln in lines), lines
    assert not any("asked for by the operator" in ln for ln in lines), lines
    lines.clear()
    argv = launcher.prepare(["--model", "/m", "--dtype", "bfloat16"], {"LD_PRELOAD": ""}, milan, {})
    assert "--dtype=float32" not in argv and argv.count("--dtype") == 1
    assert "plan: dtype bfloat16: asked for by the operator" in lines


def test_this_machines_flags_decide_its_dtype():
    # The plan of this machine carries it too (test_cli_plan's test of this machine).
    assert native_bf16(read_host()) == (cpu.serving_dtype() == "bfloat16")


def test_a_dtype_in_serve_args_is_refused_by_name():
    from zenvllm.core import gate, request

    with pytest.raises(gate.InputError, match=r"serve_args names --dtype.*give dtype instead"):
        request.from_json(json.dumps({"serve_args": ["--dtype=float32"]}))
    with pytest.raises(gate.InputError, match='dtype is "fp8", not one of auto, bfloat16'):
        request.from_json(json.dumps({"dtype": "fp8"}))
