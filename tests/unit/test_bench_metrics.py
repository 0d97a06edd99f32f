"""A bench result as Prometheus gauges (`zenvllm bench --metrics-file`)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO

from zenvllm.bench.metrics import HEADER, exposition, write_metrics_file
from zenvllm.core.errors import UserError

RESULT = json.loads((REPO / "docs/bench/qwen0.5b/results.json").read_text())
SAMPLE = re.compile(r"^(zenvllm_bench_[a-z_]+)\{([^}]*)\} (\S+)$")


def samples(text: str) -> dict[tuple[str, str], float]:
    found = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, labels, value = SAMPLE.match(line).groups()
        config = dict(re.findall(r'(\w+)="([^"]*)"', labels)).get("config", "")
        found[(name, config)] = float(value)
    return found


def test_every_configuration_is_a_series_with_the_summary_values():
    found = samples(exposition(RESULT))
    for summary in RESULT["summary"]:
        config = summary["config"]
        assert found[("zenvllm_bench_output_tokens_per_second", config)] == pytest.approx(
            summary["output_tok_s"], rel=1e-5
        )
        assert found[("zenvllm_bench_ttft_seconds", config)] == pytest.approx(
            summary["ttft_ms"] / 1000, rel=1e-5
        )
        if summary["ratio"] is not None:
            assert found[("zenvllm_bench_ratio_to_stock", config)] == pytest.approx(
                summary["ratio"], rel=1e-5
            )
    assert ("zenvllm_bench_timestamp_seconds", "") in found


def test_labels_are_escaped():
    result = {**RESULT, "meta": {**RESULT["meta"], "model": 'a"b\\c'}}
    assert 'model="a\\"b\\\\c"' in exposition(result)


def test_the_file_is_replaced_whole_and_a_foreign_one_stays(tmp_path):
    path = tmp_path / "zenvllm_bench.prom"
    write_metrics_file(path, RESULT)
    assert path.read_text().startswith(HEADER) and path.stat().st_mode & 0o777 == 0o644
    write_metrics_file(path, RESULT)  # its own file: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zenvllm_bench.prom"]
    foreign = tmp_path / "node.prom"
    foreign.write_text("node_custom 1\n")
    with pytest.raises(UserError, match="not written by zenvllm bench"):
        write_metrics_file(foreign, RESULT)
    assert foreign.read_text() == "node_custom 1\n"
    with pytest.raises(UserError, match="is not a directory"):
        write_metrics_file(tmp_path / "missing" / "x.prom", RESULT)
