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
        "calls": 144,
    }
    assert {"op": "_C::rotary_embedding", "self_cpu_pct": 7.23, "calls": 32} in rows
    assert all(r["self_cpu_pct"] <= rows[0]["self_cpu_pct"] for r in rows)


def test_zen_is_active_with_its_platform_and_its_operators():
    record = backend.verdict("zen", "ZenCpuPlatform", backend.parse_table(TABLE.read_text()))
    assert record["active"] and record["accelerated_calls"] == 144
    assert "zen active (144 calls" in backend.describe("zen-auto", "zen", record)


def test_zen_on_the_stock_platform_is_inactive_and_says_so():
    rows = [{"op": "_C::onednn_mm", "self_cpu_pct": 60.0, "calls": 144}]
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
