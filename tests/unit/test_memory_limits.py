"""Memory limits that fit: no instance's limit asks more than its host (or its cgroup)
has, over the recorded host trees and flavors, model sizes, dtypes and host counts; and
the image's vLLM plugin that lets a limit leave out the weight files' page cache."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.cli import zenvllm

from zenvllm.core.dtype import CHOICES as DTYPES
from zenvllm.core.errors import PlanError
from zenvllm.core.flavors import PRESETS, synthetic_host
from zenvllm.core.host import GIB, MIB, Host
from zenvllm.core.model import model_of_size
from zenvllm.core.plan import Policy, make_plan
from zenvllm.core.topology import read_host
from zenvllm.runtime import working_set

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
RECORDED = sorted(p for p in FIXTURES.iterdir() if (p / "sys").is_dir())


def recorded_and_presets() -> list[Host]:
    return [read_host(p) for p in RECORDED] + [synthetic_host(p) for p in sorted(PRESETS)]


def flavors() -> st.SearchStrategy[Host]:
    return st.builds(
        lambda vcpus, ram, numa: synthetic_host(f"vcpus={vcpus * numa},ram_gib={ram},numa={numa}"),
        vcpus=st.integers(1, 64),
        ram=st.integers(4, 1536),
        numa=st.sampled_from([1, 2, 4]),
    )


def limited(host: Host, limit_gib: int | None) -> Host:
    return dataclasses.replace(host, cgroup_mem_limit_bytes=limit_gib and limit_gib * GIB)


def check_limits_fit(host: Host, size: float, dtype: str, hosts: int) -> None:
    try:
        plan = make_plan(host, model_of_size(size), Policy(dtype=dtype, hosts=hosts))
    except PlanError:
        return  # a refusal asks for nothing
    have = min(host.mem_total_bytes, host.cgroup_mem_limit_bytes or host.mem_total_bytes)
    limits = [i.memory_limit_mib * MIB for i in plan.instances]
    # A pipeline's table is every host's part: each host runs the instances once.
    assert all(limit <= have for limit in limits), (limits, have)
    assert sum(limits) <= have, (limits, have)


@settings(max_examples=400, deadline=None)
@given(
    host=st.one_of(st.sampled_from(recorded_and_presets()), flavors()),
    limit_gib=st.one_of(st.none(), st.integers(2, 512)),
    size=st.sampled_from([0.5, 2, 8, 16, 40, 70, 140, 405, 800]),
    dtype=st.sampled_from(DTYPES),
    hosts=st.integers(1, 8),
)
def test_no_plan_asks_a_host_for_more_memory_than_it_has(host, limit_gib, size, dtype, hosts):
    check_limits_fit(limited(host, limit_gib), size, dtype, hosts)


def test_the_property_fails_on_a_limit_with_the_page_cache_room_again(monkeypatch):
    """The check above can fail: the old limit (the files' page cache on top) exceeds a
    96 GiB VM's memory for a 140 GiB model over two hosts."""
    from zenvllm.core import plan as planner

    fixed = planner.fixed_cost
    monkeypatch.setattr(planner, "fixed_cost", lambda m, p: fixed(m, p) + m.weight_bytes)
    with pytest.raises(AssertionError):
        check_limits_fit(synthetic_host("vcpus=24,ram_gib=96"), 140, "auto", 2)


def test_the_issues_plan_gives_limits_under_the_vms_96_gib():
    args = ("--flavor", "vcpus=24,ram_gib=96", "--model-size-gib", "140", "--hosts", "2")
    table = zenvllm("plan", *args)
    assert table.returncode == 0, table.stderr
    plan = json.loads(zenvllm("plan", *args, "--json").stdout)
    (instance,) = plan["instances"]
    assert f"--memory={instance['memory_limit_mib']}m" in instance["docker_args"]
    assert instance["memory_limit_mib"] * MIB < 96 * GIB
    assert f" {instance['memory_limit_mib']}\n" in table.stdout  # the table's mem MiB


V1_STAT = "cache 104857600\ntotal_active_file 3145728\ntotal_inactive_file 1048576\n" + (
    "active_file 2097152\ninactive_file 1048576\ntotal_rss 5242880\n"
)
V2_STAT = "anon 5242880\nfile 4194304\nactive_file 1048576\ninactive_file 3145728\nshmem 0\n"


def test_the_working_set_is_usage_less_the_file_pages_of_v1_and_v2():
    # v1's total_* (the container's subtree) over its own counters; v2's two counters.
    assert working_set.file_pages(V1_STAT) == 4 * MIB
    assert working_set.file_pages(V2_STAT) == 4 * MIB
    assert working_set.working_set(10 * MIB, V2_STAT) == 6 * MIB
    assert working_set.working_set(MIB, V2_STAT) == 0  # never below zero
    assert working_set.working_set(None, V2_STAT) is None  # no memory cgroup: unchanged
    assert working_set.file_pages("") == 0 and working_set.file_pages("active_file x\n") == 0


def test_the_plugin_corrects_vllms_reading_once(tmp_path, monkeypatch):
    """plugin() replaces vLLM's usage reader with the working set, once however often vLLM
    loads its plugins (a stand-in vllm module here; the image's real vLLM runs it in
    tests/serve/test_serve.py)."""
    stat = tmp_path / "memory.stat"
    stat.write_text(V2_STAT)
    package = tmp_path / "vllm" / "utils"
    package.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "cpu_resource_utils.py").write_text(
        "def get_cgroup_memory_usage():\n    return 10 * 2**20\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(working_set, "STATS", (tmp_path / "absent", stat))
    monkeypatch.setattr(working_set, "_registered", False)
    import vllm.utils.cpu_resource_utils as resources

    working_set.plugin()
    working_set.plugin()
    assert resources.get_cgroup_memory_usage() == 6 * MIB
