"""The bench's pace-auto: the pace image with the planner's auto layout, skipped with the
reason where PACE cannot run, measured apart from auto (another image) where it can."""

from __future__ import annotations

from pathlib import Path

import pytest

from zenvllm.bench import layouts
from zenvllm.core.host import MIB
from zenvllm.core.model import Model
from zenvllm.core.topology import read_host

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
TINY = Model(name="tiny-llama", weight_bytes=2 * MIB, kv_bytes_per_token=1024, max_model_len=512)


def resolve(fixture: str, names: list[str]):
    return layouts.resolve(names, read_host(HOSTS / fixture), TINY, 8401, 512)


def test_pace_auto_is_skipped_with_the_reason_where_the_cpu_lacks_avx512_bf16():
    configs, notes = resolve("vm-milan-8vcpu-avx2", ["stock", "auto", "pace-auto"])
    assert [c.name for c in configs] == ["stock", "auto"]
    (note,) = [n for n in notes if n.startswith("pace-auto")]
    assert note.startswith("pace-auto: skipped on this host: target pace needs ")
    assert "needs avx512f, avx512_bf16, which this CPU" in note


@pytest.mark.parametrize("fixture", ["test-machine-zen4-2cpu", "xeon-8480-spr-amx"])
def test_pace_auto_runs_the_pace_image_on_autos_layout_and_is_not_folded_into_it(fixture):
    # pace-vllm asks no vendor: an AVX-512 BF16 Xeon runs it as a Zen 4 does.
    configs, notes = resolve(fixture, ["stock", "auto", "pace-auto"])
    by_name = {c.name: c for c in configs}
    auto, pace = by_name["auto"], by_name["pace-auto"]
    assert pace.target == "pace" and pace.kind == "plan"
    assert [s.cpus for s in pace.servers] == [s.cpus for s in auto.servers]
    assert not any(n.startswith("pace-auto") for n in notes)
    assert all('"target":"pace"' in s.env["ZENVLLM_PLAN"] for s in pace.servers)
