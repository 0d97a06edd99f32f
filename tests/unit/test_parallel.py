"""Models larger than a NUMA node or a host: the planner splits a copy with vLLM's tensor
parallel, one rank per node, and cuts it into pipeline stages, one per host, instead of
refusing; copies of a bandwidth-bound model are not multiplied on a node; a model no
number of hosts given holds is refused with how many would."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zenvllm.core import plan_doc
from zenvllm.core.container import STAGE_STEP_TIMEOUT_S, container_of
from zenvllm.core.errors import PlanError
from zenvllm.core.flavors import synthetic_host
from zenvllm.core.host import GIB
from zenvllm.core.model import Model, model_of_size
from zenvllm.core.plan import Policy, make_plan
from zenvllm.core.request import Request
from zenvllm.core.topology import format_cpu_list, read_host

# A two-socket EPYC in NPS4 (8 nodes of 96 GiB) and in NPS1 (2 of 384 GiB), as issue
# reports give them, and the OpenStack blog's 24 vCPU / 96 GiB VM.
NPS4 = "vcpus=192,ram_gib=768,numa=8"
NPS1 = "vcpus=192,ram_gib=768,numa=2"
LLAMA_70B = 140  # GiB of bf16 weights


def ranks_of(plan):
    return [[r.node for r in i.ranks] for i in plan.instances]


def test_a_70b_model_on_a_two_socket_nps4_host_is_split_over_node_pairs():
    host = synthetic_host(NPS4)
    plan = make_plan(host, model_of_size(LLAMA_70B))
    assert ranks_of(plan) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    first = plan.instances[0]
    assert first.tensor_parallel_size == 2 and first.pipeline_parallel_size == 1
    assert first.mems == (0, 1)
    # One OpenMP list per rank, each on its own node's cores.
    assert first.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-22|24-46"
    assert plan.notes[0].startswith("tensor parallel 2: one copy (140.0 GiB) fits no NUMA node")
    # Each rank's 70 GiB share, runtime, shm and KV fit its 96 GiB node; the limit is the
    # two ranks' sum.
    per_rank = 70 + 2.5 + 1 + first.kv_cache_gib
    assert first.memory_limit_mib * 2**20 == pytest.approx(2 * per_rank * GIB, abs=2**20)
    assert per_rank * GIB <= 96 * GIB * 0.98 - GIB


def test_the_container_runs_vllms_tensor_parallel_over_its_ranks():
    plan = make_plan(synthetic_host(NPS4), model_of_size(LLAMA_70B))
    request = Request(deployment="big", supervisor="systemd", model_dir="/srv/m")
    container = container_of(plan.instances[0], request)
    assert "--tensor-parallel-size=2" in container.command
    assert "--cpuset-cpus=0-47" in container.options
    assert "--cpuset-mems=0-1" in container.options
    assert "--shm-size=2048m" in container.options  # the ranks exchange through it
    as_json = plan_doc.one(plan)["instances"][0]
    assert as_json["tensor_parallel_size"] == 2 and as_json["pipeline_parallel_size"] == 1
    assert [r["node"] for r in as_json["ranks"]] == [0, 1]


def test_a_model_that_fits_a_node_keeps_replicas_one_per_node_when_bandwidth_bound():
    # 140 GiB fits a 384 GiB node: copies, not ranks. Its cores cannot stream it in 50 ms,
    # so each node gets one copy (the 64-core cap would have made two per node).
    plan = make_plan(synthetic_host(NPS1), model_of_size(LLAMA_70B))
    assert [(i.node, i.tensor_parallel_size, len(i.cpus)) for i in plan.instances] == [
        (0, 1, 96),
        (1, 1, 96),
    ]
    assert any("one copy each, as their cores cannot stream" in n for n in plan.notes)


def test_a_small_model_still_splits_a_big_node_into_copies():
    # An 8 B model (16 GiB) on a 128-core node needs 86 cores: two 64-core copies (AMD's).
    plan = make_plan(synthetic_host("epyc-9755-1s-128c-1536g"), model_of_size(16))
    assert [len(i.cpus) for i in plan.instances] == [64, 64]
    assert not any(i.ranks for i in plan.instances)


def test_the_operator_can_ask_for_tensor_parallel_for_latency():
    plan = make_plan(synthetic_host(NPS1), model_of_size(16), Policy(tensor_parallel=2))
    assert ranks_of(plan) == [[0, 1]]
    with pytest.raises(PlanError, match=r"--tensor-parallel 3: .* power of two up to 2"):
        make_plan(synthetic_host(NPS1), model_of_size(16), Policy(tensor_parallel=3))


def test_recorded_nps4_tree_splits_a_model_larger_than_its_nodes(fixtures_dir):
    host = read_host(fixtures_dir / "epyc-9654-nps4")  # 4 nodes of 24 cores, 192 GiB
    assert ranks_of(make_plan(host, model_of_size(300))) == [[0, 1], [2, 3]]
    plan = make_plan(host, model_of_size(400))  # 200 GiB halves fit no 192 GiB node
    assert ranks_of(plan) == [[0, 1, 2, 3]]
    assert plan.instances[0].tensor_parallel_size == 4
    assert len(plan.instances[0].omp_threads_bind.split("|")) == 4


def test_recorded_two_socket_tree_keeps_one_copy_per_socket(fixtures_dir):
    host = read_host(fixtures_dir / "epyc-9354-2s-smt")  # 2 nodes of 32 cores, 384 GiB
    plan = make_plan(host, model_of_size(LLAMA_70B))
    assert [(i.node, i.tensor_parallel_size) for i in plan.instances] == [(0, 1), (1, 1)]
    split = make_plan(host, model_of_size(500))
    assert ranks_of(split) == [[0, 1]]


def test_a_model_no_host_of_the_kind_holds_names_how_many_would():
    with pytest.raises(PlanError) as err:
        make_plan(synthetic_host("epyc-9454-24c-96g"), model_of_size(LLAMA_70B))
    message = str(err.value)
    assert "one copy needs 144.5 GiB" in message
    assert "2 hosts of this kind would hold it, one pipeline stage each" in message
    assert "plan across them with --hosts 2" in message
    with pytest.raises(PlanError) as err:
        make_plan(synthetic_host(NPS4), model_of_size(1000))
    assert "even split over its 8 usable NUMA nodes: each rank needs" in str(err.value)
    assert "2 hosts of this kind" in str(err.value)


VM = "epyc-9454-24c-96g"  # the OpenStack blog's flavor: 24 vCPUs, 96 GiB, one node


def test_a_model_larger_than_a_vm_is_cut_into_one_stage_per_vm():
    plan = make_plan(synthetic_host(VM), model_of_size(LLAMA_70B), Policy(hosts=2))
    (group,) = plan.instances
    assert (group.pipeline_parallel_size, group.tensor_parallel_size) == (2, 1)
    assert [(r.host, r.node) for r in group.ranks] == [(0, 0), (1, 0)]
    assert plan.notes[0].startswith("pipeline parallel 2: one copy (140.0 GiB) fits no single host")
    # Each host holds half the layers: 70 GiB, the runtime, shm and KV within its node,
    # under the VM's 96 GiB.
    per_host = 70 + 2.5 + 1 + group.kv_cache_gib
    assert group.memory_limit_mib * 2**20 == pytest.approx(per_host * GIB, abs=2**20)
    assert group.memory_limit_mib * 2**20 < 96 * GIB
    assert group.env["VLLM_CPU_OMP_THREADS_BIND"] == format_cpu_list(group.omp_cpus)
    as_json = plan_doc.one(plan)["instances"][0]
    assert as_json["pipeline_parallel_size"] == 2 and as_json["tensor_parallel_size"] == 1
    assert [r["host"] for r in as_json["ranks"]] == [0, 1]


def test_the_fewest_stages_that_hold_the_model_are_taken():
    plan = make_plan(synthetic_host(VM), model_of_size(LLAMA_70B), Policy(hosts=4))
    assert plan.instances[0].pipeline_parallel_size == 2
    # A model one host holds stays whole copies, whatever --hosts allows.
    small = make_plan(synthetic_host(VM), model_of_size(16), Policy(hosts=4))
    assert all(i.pipeline_parallel_size == 1 and not i.ranks for i in small.instances)


def test_a_two_socket_host_too_small_for_a_model_takes_stages_of_ranks():
    plan = make_plan(synthetic_host(NPS4), model_of_size(1000), Policy(hosts=2))
    (group,) = plan.instances
    assert (group.pipeline_parallel_size, group.tensor_parallel_size) == (2, 8)
    assert [r.host for r in group.ranks] == [0] * 8 + [1] * 8
    assert len(group.omp_threads_bind.split("|")) == 8  # this host's ranks only
    assert "cut into 2 stages" in plan.notes[0] and "tensor parallel 8" in plan.notes[0]


def test_too_few_hosts_are_refused_with_the_number_that_would_do():
    with pytest.raises(PlanError) as err:
        make_plan(synthetic_host(VM), model_of_size(400), Policy(hosts=2))
    message = str(err.value)
    assert "does not fit these hosts even in 2 stages, one per host: each stage needs" in message
    assert "5 hosts of this kind would hold it" in message and "--hosts 5" in message
    with pytest.raises(PlanError, match=r"--hosts 0: give 1 or more"):
        make_plan(synthetic_host(VM), model_of_size(16), Policy(hosts=0))


def pipeline_container(rank: int, **asked):
    plan = make_plan(synthetic_host(VM), model_of_size(LLAMA_70B), Policy(hosts=2))
    request = Request(
        deployment="big", supervisor="systemd", model_dir="/srv/m", address="10.0.0.11"
    )
    return container_of(plan.instances[0], replace(request, host_rank=rank, **asked))


def test_the_head_serves_and_the_other_host_joins_it_headless():
    head = pipeline_container(0)
    assert [a for a in head.command if a.startswith(("--pipeline", "--nnodes", "--node-rank"))] == [
        "--pipeline-parallel-size=2",
        "--nnodes=2",
        "--node-rank=0",
    ]
    assert "--master-addr=10.0.0.11" in head.command and "--master-port=29500" in head.command
    assert "--headless" not in head.command
    assert head.env["VLLM_HOST_IP"] == "10.0.0.11"  # where it announces its message queue
    # A hung stage fails the head's step within the group's bound, not vLLM's 300 s.
    assert head.env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == str(STAGE_STEP_TIMEOUT_S) == "120"
    worker = pipeline_container(1, head_address="10.0.0.11")
    assert "--node-rank=1" in worker.command and "--headless" in worker.command
    assert "--master-addr=10.0.0.11" in worker.command
    # Only the head serves; a stage's group is reached, and its health read, at the head.
    assert head.serves and not worker.serves
    assert worker.url == head.url == "http://10.0.0.11:8001"
    assert head.group_port == worker.group_port == 29500


def test_the_step_timeout_is_set_for_groups_only_and_the_operator_may_set_it():
    assert (
        pipeline_container(0, extra_env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "600"}).env[
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
        ]
        == "600"
    )
    whole = make_plan(synthetic_host(VM), model_of_size(16), Policy()).instances[0]
    request = Request(deployment="one", supervisor="systemd", model_dir="/srv/m")
    assert "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS" not in container_of(whole, request).env


def test_a_stage_container_refuses_what_vllm_could_not_run():
    with pytest.raises(PlanError, match="host rank 2: zenvllm-0 has 2 pipeline stages"):
        pipeline_container(2, head_address="10.0.0.11")
    with pytest.raises(PlanError, match="give the head host's address"):
        pipeline_container(1)
    with pytest.raises(PlanError, match="remove --enforce-eager"):
        pipeline_container(0, serve_args=("--enforce-eager",))
    with pytest.raises(PlanError, match="head port 65536 of zenvllm-0 runs past 65535"):
        pipeline_container(0, head_port=65536)


def test_float32_on_zen3_can_turn_a_fitting_copy_into_a_split():
    # 60 GiB of bf16 weights are 120 GiB in float32: over a 96 GiB Zen 3 node, so split.
    host = synthetic_host("vcpus=64,ram_gib=192,numa=2,cpu=milan")
    model = Model("m", weight_bytes=60 * GIB, kv_bytes_per_token=2048)
    plan = make_plan(host, model)
    assert plan.model.dtype == "float32" and ranks_of(plan) == [[0, 1]]
    assert make_plan(host, model, Policy(dtype="bfloat16")).instances[0].ranks == ()
