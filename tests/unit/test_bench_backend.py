"""The bench's read-back of what vLLM ran: the profiler's table parsed, and a zen
configuration called zen only when its platform and zentorch's operators say so."""

from __future__ import annotations

from pathlib import Path

from zenvllm.bench import backend

# The table vLLM's worker wrote for one 16-token request to the zen image (tiny model,
# ZenCpuPlatform on an AMD Zen 5, 2026-11-24).
TABLE = Path(__file__).parents[1] / "fixtures" / "profiler" / "zen-tiny-llama.profiler_out.txt"


def test_the_table_gives_each_operator_its_share_and_calls():
    rows = backend.parse_table(TABLE.read_text())
    assert rows[0] == {
        "op": "zentorch::zentorch_linear_unary",
        "self_cpu_pct": 57.11,
        "avg_us": 2312.0,
        "calls": 144,
    }
    assert {
        "op": "_C::rotary_embedding",
        "self_cpu_pct": 7.23,
        "avg_us": 1314.0,
        "calls": 32,
    } in rows
    assert {"op": "aten::as_strided", "self_cpu_pct": 0.08, "avg_us": 0.309, "calls": 1528} in rows
    assert all(r["self_cpu_pct"] <= rows[0]["self_cpu_pct"] for r in rows)


def test_zen_is_active_with_its_platform_and_its_operators():
    record = backend.verdict("zen", "ZenCpuPlatform", backend.parse_table(TABLE.read_text()))
    assert record["active"] and record["accelerated_calls"] == 144
    assert "zen active (144 calls" in backend.describe("zen-auto", "zen", record)


def test_zen_on_the_stock_platform_is_inactive_and_says_so():
    rows = [{"op": "_C::onednn_mm", "self_cpu_pct": 60.0, "avg_us": 2000.0, "calls": 144}]
    record = backend.verdict("zen", "CpuPlatform", rows)
    assert not record["active"] and record["accelerated_calls"] == 0
    assert "INACTIVE: not presented as zen" in backend.describe("zen-auto", "zen", record)


def test_a_platform_without_the_operators_is_not_enough():
    record = backend.verdict("zen", "ZenCpuPlatform", [])
    assert not record["active"]


def test_stock_targets_record_the_platform_only():
    record = backend.verdict("vllm-openai", "CpuPlatform", [])
    assert record == {"platform": "CpuPlatform", "top_ops": []}


def test_the_profiler_argument_is_one_json_value():
    (arg,) = backend.serve_args()
    assert arg.startswith("--profiler-config={") and '"torch_profiler_dir":"/profile"' in arg


def test_check_refuses_a_run_whose_zen_did_not_run_and_the_table_says_what_ran():
    from zenvllm.bench import recompute, tables

    rows = backend.parse_table(TABLE.read_text())
    configs = [
        {
            "name": "zen-auto",
            "target": "zen",
            "backend": backend.verdict("zen", "ZenCpuPlatform", rows),
            "start": {"ready_s": 52.0, "compile_cache": "cold"},
            "restart": {"ready_s": 27.7, "compile_cache": "warm"},
        },
        {
            "name": "zen-single",
            "target": "zen",
            "backend": backend.verdict("zen", "CpuPlatform", []),
        },
        {"name": "llamacpp", "target": "llamacpp"},
    ]
    assert recompute.backend_problems(configs) == [
        "zen-single: its zen acceleration did not run (platform CpuPlatform, 0 calls of its "
        "operators): not a measurement of that target"
    ]
    table = tables.ran_table(configs).splitlines()
    assert table[-2] == (
        "| zen-auto | ZenCpuPlatform | active (144 calls) | zentorch::zentorch_linear_unary "
        "(144) | 52 s (cold) | 27.7 s (warm) |"
    )
    assert table[-1] == "| zen-single | CpuPlatform | INACTIVE (0 calls) | - | - | - |"
