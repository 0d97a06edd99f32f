"""The topology reader: pure parsers, every fixture tree, and the real host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require
from hypothesis import given
from hypothesis import strategies as st

from zenvllm.core.errors import UserError
from zenvllm.core.host import GIB, Host
from zenvllm.core.topology import (
    format_cpu_list,
    parse_cpu_list,
    parse_cpuinfo,
    parse_meminfo,
    parse_memory_limit,
    parse_proc_cgroup,
    read_cgroup,
    read_host,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
FIXTURE_NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "fixture.json").is_file())


def host(name: str) -> Host:
    return read_host(FIXTURES / name)


# ------------------------------------------------------------------ parsers


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)),
        ("0", (0,)),
        ("", ()),
        ("\n", ()),
        ("5,1-2\n", (1, 2, 5)),
        ("0-1,1-2", (0, 1, 2)),
    ],
)
def test_parse_cpu_list(text: str, ids: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == ids


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "-1", "0-3,x"])
def test_parse_cpu_list_rejects_garbage_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="bad CPU list"):
        parse_cpu_list(text)


def test_format_cpu_list() -> None:
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert format_cpu_list([]) == ""
    assert format_cpu_list([7]) == "7"


@given(st.sets(st.integers(min_value=0, max_value=4096)))
def test_cpu_list_round_trip(ids: set[int]) -> None:
    text = format_cpu_list(ids)
    assert parse_cpu_list(text) == tuple(sorted(ids))
    assert format_cpu_list(parse_cpu_list(text)) == text  # canonical form is stable
    assert len(text.split(",")) <= max(len(ids), 1)


def test_parse_meminfo_proc_and_node() -> None:
    proc = parse_meminfo("MemTotal:       24684084 kB\nHugePages_Total:     0\n")
    assert proc == {"MemTotal": 24684084 * 1024, "HugePages_Total": 0}
    node = parse_meminfo("Node 1 MemTotal:        4286668 kB\nNode 1 MemFree:  3536304 kB\n")
    assert node == {"MemTotal": 4286668 * 1024, "MemFree": 3536304 * 1024}


def test_parse_cpuinfo_takes_the_first_processor() -> None:
    text = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9454\n"
        "flags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\nvendor_id\t: Other\nflags\t\t: x\n"
    )
    info = parse_cpuinfo(text)
    assert (info.vendor, info.model_name) == ("AuthenticAMD", "AMD EPYC 9454")
    assert info.flags == {"fpu", "avx2", "avx512f"}
    assert parse_cpuinfo("").flags == frozenset()


def test_parse_proc_cgroup() -> None:
    paths = parse_proc_cgroup("4:memory:/a/b\n3:cpuset,cpu:/c\n0::/d\n")
    assert paths == {"memory": "/a/b", "cpuset": "/c", "cpu": "/c", "": "/d"}


@pytest.mark.parametrize(
    ("text", "limit"),
    [("max\n", None), ("9223372036854771712\n", None), ("17179869184\n", 16 * GIB), ("", None)],
)
def test_parse_memory_limit(text: str, limit: int | None) -> None:
    assert parse_memory_limit(text) == limit


# ------------------------------------------------------------------ fixtures vs their declarations


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_matches_its_declaration(name: str) -> None:
    expect = json.loads((FIXTURES / name / "fixture.json").read_text())
    h = host(name)
    assert format_cpu_list(c.id for c in h.cpus) == expect["online_cpus"]
    assert len(h.cpus) == expect["n_cpus"]
    assert len({c.core for c in h.cpus}) == expect["n_cores"]
    assert len({c.package for c in h.cpus}) == expect["packages"]
    assert h.smt is expect["smt"]
    assert len(h.nodes) == expect["n_nodes"]
    assert {str(n.id): format_cpu_list(n.cpus) for n in h.nodes} == expect["node_cpus"]
    assert [n.id for n in h.nodes if not n.cpus] == expect["memory_only_nodes"]
    assert len({c.l3 for c in h.cpus}) == expect["l3_domains"]
    assert format_cpu_list(h.allowed_cpus) == expect["allowed_cpus"]
    assert format_cpu_list(h.allowed_mems) == expect["allowed_mems"]
    assert h.cgroup_mem_limit_bytes == expect["cgroup_mem_limit_bytes"]
    assert h.mem_total_bytes == expect["mem_total_bytes"]
    assert sorted(h.isa) == expect["isa"]
    assert (h.vendor, h.model_name) == (expect["vendor"], expect["model_name"])


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_host_is_consistent(name: str) -> None:
    assert_consistent(host(name))


def assert_consistent(h: Host) -> None:
    ids = [c.id for c in h.cpus]
    assert ids == sorted(set(ids)) and ids
    assert [n.id for n in h.nodes] == sorted({n.id for n in h.nodes})
    # Every CPU sits in exactly one node, and that node lists it.
    listed = [cpu for n in h.nodes for cpu in n.cpus]
    assert sorted(listed) == ids
    for c in h.cpus:
        assert c.id in h.node(c.node).cpus
        # Keys are the lowest CPU of their group, so they name a real CPU of that group.
        assert h.cpu(c.core).core == c.core and h.cpu(c.core).package == c.package
        assert h.cpu(c.l3).l3 == c.l3 and c.l3 <= c.id and c.core <= c.id
    assert h.allowed_cpus <= set(ids) and h.allowed_cpus
    assert h.allowed_mems <= {n.id for n in h.nodes} and h.allowed_mems
    assert h.mem_total_bytes > 0 and 0 < h.mem_available_bytes <= h.mem_total_bytes
    assert all(0 <= n.mem_free_bytes <= n.mem_total_bytes for n in h.nodes)
    assert sum(n.mem_total_bytes for n in h.nodes) >= h.mem_total_bytes * 0.9
    assert h.vendor and h.model_name and "avx2" in h.flags


def test_committed_fixture_trees_match_the_generator(repo: Path) -> None:
    gen = repo / "tests" / "fixtures" / "make_hosts.py"
    done = subprocess.run([sys.executable, gen, "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_at_least_eight_fixtures() -> None:
    assert len(FIXTURE_NAMES) >= 8


# ------------------------------------------------------------------ hand-checked values
# Written from the kernel's documented layout, not from the generator, so the
# generator and the reader cannot agree on a bug silently.


def test_test_machine_copy() -> None:
    h = host("test-machine-zen4-2cpu")
    assert [(c.id, c.core, c.package, c.node, c.l3) for c in h.cpus] == [
        (0, 0, 0, 0, 0),
        (1, 1, 0, 0, 0),
    ]
    assert not h.smt
    assert h.vendor == "AuthenticAMD"
    assert {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"} <= h.flags
    assert h.mem_total_bytes == 24684084 * 1024
    assert h.mem_available_bytes == 24321188 * 1024
    # node0 says 4 GiB (a Firecracker quirk) but it is the only node: /proc wins.
    assert h.nodes[0].mem_total_bytes == 24684084 * 1024
    assert h.cgroup_mem_limit_bytes is None  # v1 "unlimited" is no limit


def test_openstack_vm_siblings_are_adjacent() -> None:
    h = host("vm-openstack-9454-24vcpu")
    assert len(h.cpus) == 24 and h.smt
    assert h.cpu(0).core == h.cpu(1).core == 0
    assert h.cpu(22).core == h.cpu(23).core == 22
    assert h.cpu(1).core != h.cpu(2).core
    assert len({c.core for c in h.cpus}) == 12
    assert 90 * GIB < h.nodes[0].mem_total_bytes < 96 * GIB


def test_epyc_9755_ccd_l3_and_linux_sibling_order() -> None:
    h = host("epyc-9755-1s-nps1")
    assert len(h.cpus) == 256 and len(h.nodes) == 1
    assert h.cpu(0).core == h.cpu(128).core == 0  # sibling of CPU n is n + 128
    assert h.cpu(127).core == h.cpu(255).core == 127
    assert h.cpu(7).l3 == h.cpu(135).l3 == 0 and h.cpu(8).l3 == 8 and h.cpu(136).l3 == 8
    assert len({c.l3 for c in h.cpus}) == 16
    assert h.nodes[0].mem_total_bytes > 1400 * GIB


def test_smt_off_at_run_time_drops_offline_cpus() -> None:
    h = host("epyc-9354-smt-off")
    assert [c.id for c in h.cpus] == list(range(32))
    assert not h.smt
    assert h.nodes[0].cpus == tuple(range(32))


def test_two_sockets_core_id_repeats_but_cores_stay_distinct() -> None:
    h = host("epyc-9354-2s-smt")
    assert (
        FIXTURES / "epyc-9354-2s-smt/sys/devices/system/cpu/cpu32/topology/core_id"
    ).read_text() == "0\n"
    assert h.cpu(0).core != h.cpu(32).core
    assert h.cpu(32).package == 1 and h.cpu(32).node == 1 and h.cpu(96).core == 32
    assert h.node(0).cpus == (*range(0, 32), *range(64, 96))
    assert len({c.core for c in h.cpus}) == 64


def test_nps4_four_nodes_of_24_cores() -> None:
    h = host("epyc-9654-nps4")
    assert [len(n.cpus) for n in h.nodes] == [48, 48, 48, 48]
    assert h.node(1).cpus == (*range(24, 48), *range(120, 144))
    assert {c.node for c in h.cpus if c.l3 == 24} == {1}  # an L3 never spans nodes


def test_memory_only_node() -> None:
    h = host("epyc-9124-cxl-memnode")
    assert h.node(1).cpus == ()
    assert h.node(1).mem_total_bytes > 250 * GIB
    assert h.allowed_mems == {0, 1}
    assert all(c.node == 0 for c in h.cpus)


def test_cgroup_v2_container() -> None:
    h = host("container-cgroup2-cpuset4-7")
    assert len(h.cpus) == 64  # the container sees the host's CPUs ...
    assert h.allowed_cpus == {4, 5, 6, 7}  # ... and may use only these
    assert h.cgroup_mem_limit_bytes == 16 * GIB


def test_cgroup_v2_private_namespace() -> None:
    h = host("container-cgroup2-private-ns")
    assert h.allowed_cpus == set(range(12))
    assert h.cgroup_mem_limit_bytes == 48 * GIB


def test_cgroup_v1_container_with_missing_path_falls_back_to_mount() -> None:
    root = FIXTURES / "container-cgroup1"
    assert not (root / "sys/fs/cgroup/memory/docker").exists()
    h = read_host(root)
    assert h.allowed_cpus == {0, 1, 2, 3, 16, 17, 18, 19}
    assert h.cgroup_mem_limit_bytes == 8 * GIB
    assert read_cgroup(root).version == 1


def test_intel_sapphire_rapids() -> None:
    h = host("xeon-8480-spr-amx")
    assert h.vendor == "GenuineIntel"
    assert {"amx_bf16", "amx_tile", "avx512_bf16", "avx512f"} <= h.isa
    assert len({c.l3 for c in h.cpus}) == 1


def test_no_numa_sysfs_is_one_node_with_everything() -> None:
    h = host("vm-no-numa-sysfs")
    assert len(h.nodes) == 1 and h.nodes[0].id == 0
    assert h.nodes[0].cpus == (0, 1, 2, 3)
    assert h.nodes[0].mem_total_bytes == h.mem_total_bytes
    assert "avx512f" not in h.flags and "avx2" in h.flags


# ------------------------------------------------------------------ edge cases on copies


def test_missing_l3_falls_back_to_package(tmp_path: Path) -> None:
    root = tmp_path / "h"
    shutil.copytree(FIXTURES / "epyc-9354-2s-smt", root)
    for d in (root / "sys/devices/system/cpu").glob("cpu*/cache"):
        shutil.rmtree(d)
    h = read_host(root)
    assert {c.l3 for c in h.cpus} == {0, 32}  # lowest CPU of each package


def test_nested_v2_limit_takes_the_tightest_ancestor(tmp_path: Path) -> None:
    root = tmp_path / "h"
    shutil.copytree(FIXTURES / "container-cgroup2-cpuset4-7", root)
    (root / "sys/fs/cgroup/system.slice/memory.max").write_text("8589934592\n")
    assert read_host(root).cgroup_mem_limit_bytes == 8 * GIB


def test_root_without_sysfs_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"sys/devices/system/cpu.*--root"):
        read_host(tmp_path)


@pytest.mark.parametrize(
    ("rel", "garbage"),
    [
        ("sys/devices/system/cpu/cpu3/topology/core_id", "three\n"),
        ("sys/devices/system/node/node0/cpulist", "0-x\n"),
        ("sys/fs/cgroup/system.slice/docker-5d1c0ffee0ddba11.scope/memory.max", "lots\n"),
    ],
)
def test_corrupt_file_is_a_user_error_naming_it(tmp_path: Path, rel: str, garbage: str) -> None:
    root = tmp_path / "h"
    shutil.copytree(FIXTURES / "container-cgroup2-cpuset4-7", root)
    (root / rel).write_text(garbage)
    with pytest.raises(UserError, match=rel.split("/")[-1]):
        read_host(root)


# ------------------------------------------------------------------ the real host


def test_real_host_is_consistent() -> None:
    require(Path("/sys/devices/system/cpu/online").exists(), "no sysfs here")
    h = read_host()
    assert_consistent(h)
    assert len(h.allowed_cpus) == len(os.sched_getaffinity(0)) or h.allowed_cpus >= set(
        os.sched_getaffinity(0)
    )
    # The flags are whatever this CPU has: compare with the file, never hardcode.
    first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    flags_line = next(line for line in first.splitlines() if line.startswith("flags"))
    assert h.flags == set(flags_line.split(":", 1)[1].split())
    assert h.mem_total_bytes == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_real_host_honours_the_process_affinity() -> None:
    require(len(os.sched_getaffinity(0)) >= 2, "needs at least two CPUs to narrow")
    first = min(os.sched_getaffinity(0))
    code = (
        f"import os; os.sched_setaffinity(0, {{{first}}}); "
        "from zenvllm.core.topology import read_host; print(sorted(read_host().allowed_cpus))"
    )
    scripts = Path(__file__).resolve().parents[2] / "scripts"
    env = {**os.environ, "PYTHONPATH": str(scripts)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[{first}]"
