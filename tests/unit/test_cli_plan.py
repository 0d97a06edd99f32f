"""`zenvllm plan` as a command: the JSON contract, the table, and clean refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import cpu
from support.cli import zenvllm

from zenvllm.core.topology import parse_cpu_list

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
INSTANCE_KEYS = {
    "name",
    "port",
    "cpus",
    "mems",
    "omp_threads_bind",
    "kv_cache_gib",
    "shm_size_mib",
    "env",
    "docker_args",
}


def fixture_roots():
    return (
        sorted(p for p in FIXTURES.iterdir() if (p / "sys").is_dir()) if FIXTURES.exists() else []
    )


def check_contract(plan: dict) -> None:
    assert {"host", "instances", "warnings"} <= plan.keys()
    assert plan["host"]["cpus"] and plan["host"]["nodes"]
    assert plan["instances"]
    # vLLM's scheduler runs max_num_seqs (256) requests per instance at once.
    assert plan["max_concurrency"] == 256 * len(plan["instances"])
    for inst in plan["instances"]:
        assert inst.keys() >= INSTANCE_KEYS
        assert isinstance(inst["kv_cache_gib"], int) and inst["kv_cache_gib"] >= 1
        assert set(parse_cpu_list(inst["omp_threads_bind"])) <= set(inst["cpus"])
        assert inst["env"]["VLLM_CPU_OMP_THREADS_BIND"] == inst["omp_threads_bind"]
        assert f"--shm-size={inst['shm_size_mib']}m" in inst["docker_args"]


@pytest.mark.parametrize("root", fixture_roots(), ids=lambda p: p.name)
def test_plan_json_for_every_fixture(root):
    result = zenvllm("plan", "--root", str(root), "--model-size-gib", "1", "--json")
    assert result.returncode == 0, result.stderr
    check_contract(json.loads(result.stdout))


def test_fixtures_exist_for_the_planner():
    assert len(fixture_roots()) >= 8


def test_plan_on_this_machine_table_and_json():
    table = zenvllm("plan")
    assert table.returncode == 0, table.stderr
    assert "zenvllm-0" in table.stdout and "why:" in table.stdout
    result = zenvllm("plan", "--json")
    plan = json.loads(result.stdout)
    check_contract(plan)
    with open("/proc/cpuinfo") as f:
        online = sum(1 for line in f if line.startswith("processor"))
    assert len(plan["host"]["cpus"]) == online
    # The CPU's own numbers and flags, as cpuinfo gives them, decide its name and dtype.
    assert plan["host"]["family"] == int(cpu.cpuinfo_field("cpu family"))
    assert plan["host"]["cpu_model"] == int(cpu.cpuinfo_field("model"))
    wanted = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile"}
    assert plan["host"]["isa"] == sorted(wanted & cpu.cpuinfo_flags())
    expected = cpu.serving_dtype()
    assert plan["model"]["dtype"] == expected
    assert all(f"--dtype={expected}" in i["container"]["command"] for i in plan["instances"])


def test_impossible_model_exits_non_zero_naming_needed_and_available_gib():
    result = zenvllm("plan", "--flavor", "epyc-9454-24c-96g", "--model-size-gib", "140", "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "needs 144.5 GiB" in result.stderr and "93.1 GiB usable of 96.0 GiB" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--flavor", "m1.huge"], "unknown flavor 'm1.huge'; presets are"),
        (["--flavor", "vcpus=7,ram_gib=8,smt=2"], "7 vCPUs do not split evenly"),
        (["--flavor", "vcpus=8,ram=8"], "'ram=8' is not one of vcpus=, ram_gib=, numa=, smt="),
        (["--flavor", "vcpus=8,ram_gib=8,vcpus=4"], "gives vcpus twice; describe it as"),
        (["--root", "/nonexistent"], "/nonexistent"),
        (["--model", "/nonexistent"], "no config.json"),
        (["--instances", "0"], "argument --instances: '0' is not a whole number of 1 or more"),
        (["--kv-fraction", "nan"], "argument --kv-fraction: 'nan' is not a number in (0, 1]"),
    ],
)
def test_bad_input_is_refused_cleanly(args, message):
    result = zenvllm("plan", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert message in result.stderr


def test_a_flavor_preset_plans_without_the_host():
    result = zenvllm(
        "plan", "--flavor", "epyc-9755-2s-256c-3072g", "--model-size-gib", "16", "--json"
    )
    plan = json.loads(result.stdout)
    assert [i["mems"] for i in plan["instances"]] == [[0], [0], [1], [1]]


def test_a_model_over_several_vms_is_planned_per_host_and_each_host_gets_its_container():
    vm = ("plan", "--flavor", "epyc-9454-24c-96g", "--model-size-gib", "140")
    refused = zenvllm(*vm)
    assert refused.returncode == 2 and "plan across them with --hosts 2" in refused.stderr
    head = zenvllm(*vm, "--hosts", "2", "--json")
    assert head.returncode == 0, head.stderr
    (group,) = json.loads(head.stdout)["instances"]
    assert group["pipeline_parallel_size"] == 2
    assert [r["host"] for r in group["ranks"]] == [0, 1]
    assert "--node-rank=0" in group["container"]["command"]
    worker = zenvllm(
        *vm, "--hosts", "2", "--host-rank", "1", "--head-address", "10.0.0.11", "--json"
    )
    command = json.loads(worker.stdout)["instances"][0]["container"]["command"]
    assert {"--node-rank=1", "--master-addr=10.0.0.11", "--headless"} <= set(command)
    table = zenvllm(*vm, "--hosts", "2").stdout
    assert "cut over 2 hosts of this kind, one stage per host" in table


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--hosts", "0"), "--hosts"),
        (("--hosts", "2", "--host-rank", "1", "--json"), "give the head host's address"),
        (("--head-address", "head.example"), "not an IP address"),
    ],
)
def test_bad_pipeline_options_are_refused_by_name(flags, said):
    result = zenvllm("plan", "--flavor", "epyc-9454-24c-96g", "--model-size-gib", "140", *flags)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
