"""The planner's rules, its invariants over random hosts, and its refusals."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zenvllm.core.errors import PlanError
from zenvllm.core.flavors import CPU_MODELS, PRESETS, synthetic_host
from zenvllm.core.host import GIB, MIB
from zenvllm.core.memory import node_budget
from zenvllm.core.model import Model, model_of_size
from zenvllm.core.plan import Policy, Rank, make_plan
from zenvllm.core.topology import parse_cpu_list

TINY = Model(name="tiny", weight_bytes=2 * MIB, kv_bytes_per_token=1024, max_model_len=512)


def flavor(vcpus, ram, numa=1, smt=1, cpu="genoa"):
    return synthetic_host(f"vcpus={vcpus},ram_gib={ram},numa={numa},smt={smt},cpu={cpu}")


def check_invariants(plan, host):
    seen: set[int] = set()
    per_node: dict[int, float] = {}
    for inst in plan.instances:
        cpus = set(inst.cpus)
        assert cpus, inst
        assert not cpus & seen, f"{inst.name} shares CPUs"
        seen |= cpus
        assert cpus <= host.allowed_cpus
        ranks = inst.ranks or (Rank(inst.node, inst.cpus, inst.omp_cpus),)
        assert inst.tensor_parallel_size == len(ranks)
        assert len({r.node for r in ranks}) == len(ranks), "two ranks on one node"
        for r in ranks:
            assert {host.cpu(c).node for c in r.cpus} == {r.node}, "a rank crosses a node"
            assert set(r.omp_cpus) <= set(r.cpus)
        assert {c for r in ranks for c in r.cpus} == cpus
        assert set(inst.omp_cpus) <= cpus
        cores = [host.cpu(c).core for c in inst.omp_cpus]
        assert len(cores) == len(set(cores)), "two OpenMP threads on one physical core"
        binds = inst.omp_threads_bind.split("|")
        assert [parse_cpu_list(b) for b in binds] == [r.omp_cpus for r in ranks]
        assert inst.env["VLLM_CPU_OMP_THREADS_BIND"] == inst.omp_threads_bind
        assert inst.env["VLLM_CPU_KVCACHE_SPACE"] == str(inst.kv_cache_gib)
        assert inst.kv_cache_gib >= plan.policy.min_kv_cache_gib
        # The limit is what the ranks hold (weights, runtime, shm, KV; no page cache:
        # runtime/working_set.py), each rank's share within its node's budget.
        assert inst.memory_limit_mib * MIB <= host.mem_total_bytes
        for r in ranks:
            share = (inst.memory_limit_mib * MIB - MIB) / len(ranks)
            per_node[r.node] = per_node.get(r.node, 0) + share
    for node_id, used in per_node.items():
        assert used <= node_budget(host.node(node_id).mem_total_bytes, plan.policy)
    if host.cgroup_mem_limit_bytes:
        assert sum(per_node.values()) <= host.cgroup_mem_limit_bytes
    ports = [i.port for i in plan.instances]
    assert len(set(ports)) == len(ports)


hosts = st.builds(
    lambda cores, numa, smt, ram, cpu: flavor(cores * numa * smt, ram * numa, numa, smt, cpu),
    cores=st.integers(1, 48),
    numa=st.sampled_from([1, 2, 4]),
    smt=st.sampled_from([1, 2]),
    ram=st.integers(4, 512),
    cpu=st.sampled_from(sorted(c for c in CPU_MODELS if c != "milan")),
)


@st.composite
def restricted(draw, host_strategy=hosts):
    """A host, sometimes seen from inside a cgroup (fewer CPUs, a memory limit)."""
    host = draw(host_strategy)
    ids = sorted(c.id for c in host.cpus)
    allowed = draw(st.sets(st.sampled_from(ids), min_size=1)) if draw(st.booleans()) else set(ids)
    limit = draw(st.one_of(st.none(), st.integers(2, 256).map(lambda g: g * GIB)))
    return dataclasses.replace(host, allowed_cpus=frozenset(allowed), cgroup_mem_limit_bytes=limit)


@settings(max_examples=300, deadline=None)
@given(
    host=restricted(),
    size=st.sampled_from([0.002, 0.5, 2, 8, 16, 40, 140]),
    instances=st.one_of(st.none(), st.integers(1, 16)),
    layout=st.sampled_from(["contiguous", "interleaved"]),
)
def test_any_plan_keeps_the_invariants(host, size, instances, layout):
    policy = Policy(instances=instances, layout=layout)
    model = model_of_size(size)
    try:
        plan = make_plan(host, model, policy)
    except PlanError as err:
        assert "GiB" in str(err) or "--instances" in str(err) or "cpuset" in str(err)
        return
    check_invariants(plan, host)
    assert make_plan(host, model, policy) == plan, "same input, same plan"
    if instances is not None:
        assert len(plan.instances) <= instances


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_plans_and_covers_its_cores(preset):
    host = synthetic_host(preset)
    plan = make_plan(host, model_of_size(8))
    check_invariants(plan, host)
    assert set().union(*(set(i.cpus) for i in plan.instances)) == host.allowed_cpus


def test_amd_9755_splits_into_two_64_core_instances_for_an_8b_model():
    plan = make_plan(synthetic_host("epyc-9755-1s-128c-1536g"), model_of_size(16))
    assert [len(i.cpus) for i in plan.instances] == [64, 64]
    # No SMT: one core of each 64-core slice is left to the API server.
    assert [len(i.omp_cpus) for i in plan.instances] == [63, 63]


def test_two_sockets_get_an_instance_per_node_and_local_memory():
    plan = make_plan(synthetic_host("epyc-9755-2s-256c-3072g"), model_of_size(16))
    assert [(i.node, i.mems) for i in plan.instances] == [
        (0, (0,)),
        (0, (0,)),
        (1, (1,)),
        (1, (1,)),
    ]


def test_smt_siblings_serve_the_api_server_and_omp_takes_one_per_core():
    host = synthetic_host("epyc-9454-24c-96g")  # 12 cores x 2 threads, sibling of c is c+12
    (inst,) = make_plan(host, model_of_size(16)).instances
    assert inst.cpus == tuple(range(24))
    assert inst.omp_cpus == tuple(range(12, 24))  # the highest sibling, like vLLM's auto


def test_small_model_on_the_two_core_test_machine_gets_one_two_core_instance():
    plan = make_plan(flavor(2, 24, cpu="genoa"), TINY)
    # One core would stream the weights, but without SMT a 1-core instance shares its
    # core with its API server and scheduler: at least 2 cores, OpenMP on both.
    assert [(i.cpus, i.omp_threads_bind, i.port) for i in plan.instances] == [((0, 1), "0-1", 8001)]
    assert "need 1 core(s) per instance" in plan.notes[0]
    assert "without SMT at least 2" in plan.notes[0]
    # KV is capped by what 256 sequences of 512 tokens can use, then raised to the minimum.
    assert [i.kv_cache_gib for i in plan.instances] == [1]
    assert any("OpenMP gets every core" in n for n in plan.notes)
    assert not plan.warnings


def test_with_smt_a_small_model_gets_a_core_and_its_sibling_per_instance():
    plan = make_plan(flavor(8, 64, smt=2), TINY)
    assert len(plan.instances) == 4
    assert {len(i.cpus) for i in plan.instances} == {2}  # one core, both its threads
    assert "without SMT" not in plan.notes[0]


def test_small_slices_without_smt_give_openmp_every_core():
    plan = make_plan(flavor(8, 64), model_of_size(0.5), Policy(instances=2))
    assert [(i.cpus, i.omp_threads_bind) for i in plan.instances] == [
        ((0, 1, 2, 3), "0-3"),
        ((4, 5, 6, 7), "4-7"),
    ]


def test_big_slices_without_smt_keep_a_core_apart_like_vllm():
    plan = make_plan(flavor(16, 64), model_of_size(0.5), Policy(instances=2))
    assert [(i.cpus, i.omp_threads_bind) for i in plan.instances] == [
        (tuple(range(8)), "0-6"),
        (tuple(range(8, 16)), "8-14"),
    ]
    assert not any("OpenMP gets every core" in n for n in plan.notes)
    # The threshold is a policy knob.
    plan = make_plan(flavor(8, 64), model_of_size(0.5), Policy(instances=2, reserve_from_cores=4))
    assert [i.omp_threads_bind for i in plan.instances] == ["0-2", "4-6"]


def test_smt_slices_leave_the_siblings_and_keep_every_core():
    plan = make_plan(flavor(16, 64, smt=2), model_of_size(0.5), Policy(instances=2))
    for inst in plan.instances:
        assert len(inst.omp_cpus) == len(inst.cpus) // 2


def test_interleaved_layout_deals_cores_round_robin():
    plan = make_plan(flavor(8, 64), model_of_size(0.5), Policy(instances=2, layout="interleaved"))
    assert [i.cpus for i in plan.instances] == [(0, 2, 4, 6), (1, 3, 5, 7)]
    plan = make_plan(flavor(8, 64), model_of_size(0.5), Policy(instances=2))
    assert [i.cpus for i in plan.instances] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_kv_cache_is_the_nodes_leftover_times_the_fraction():
    host = flavor(4, 64)
    plan = make_plan(host, model_of_size(10), Policy(instances=2, kv_fraction=0.5))
    budget = 64 * GIB - (1 * GIB + 0.02 * 64 * GIB)
    fixed = 10 * GIB + 2.5 * GIB + 1024 * MIB
    expected = int((budget - 2 * fixed) * 0.5 / 2 // GIB)
    assert [i.kv_cache_gib for i in plan.instances] == [expected, expected]
    # The limit is weights, runtime, shm and KV: no room for the files' page cache.
    assert plan.instances[0].memory_limit_mib == (fixed + expected * GIB) // MIB


def test_cgroup_limit_caps_the_kv_cache():
    host = dataclasses.replace(flavor(4, 64), cgroup_mem_limit_bytes=16 * GIB)
    (inst,) = make_plan(host, model_of_size(4), Policy(instances=1)).instances
    # weights 4 + runtime 2.5 + shm 1 charged to the cgroup before the KV cache
    assert inst.kv_cache_gib == int(((16 * 0.98) - 7.5) * 0.9)
    assert inst.memory_limit_mib * MIB <= 16 * GIB


def test_model_larger_than_the_node_is_refused_with_the_numbers():
    with pytest.raises(PlanError) as err:
        make_plan(synthetic_host("epyc-9454-24c-96g"), model_of_size(140))
    message = str(err.value)
    assert "144.5 GiB" in message  # 140 weights + 2.5 runtime + 1 shm + 1 KV
    assert "93.1 GiB usable of 96.0 GiB" in message
    assert "quantized" in message


def test_kv_below_the_minimum_is_refused():
    host = dataclasses.replace(flavor(4, 64), cgroup_mem_limit_bytes=8 * GIB)
    with pytest.raises(PlanError, match=r"below the 1 GiB minimum.*cgroup memory limit 8\.0 GiB"):
        make_plan(host, model_of_size(4), Policy(instances=1))


def test_no_usable_cores_is_refused():
    host = dataclasses.replace(flavor(4, 64), allowed_cpus=frozenset())
    with pytest.raises(PlanError, match="no usable CPUs"):
        make_plan(host, TINY)


def test_too_many_explicit_instances_is_refused():
    with pytest.raises(PlanError, match="--instances 9 is more than the 8 usable physical cores"):
        make_plan(flavor(8, 64), TINY, Policy(instances=9))


@pytest.mark.parametrize(
    ("cpu", "lacks"),
    [("milan", "avx512f, avx512_bf16"), ("sapphire-rapids", "vendor AuthenticAMD")],
)
def test_zen_target_where_it_cannot_accelerate_is_refused_naming_the_way_on(cpu, lacks):
    with pytest.raises(PlanError, match=f"target zen needs {lacks}") as refused:
        make_plan(flavor(8, 32, cpu=cpu), TINY, Policy(target="zen"))
    assert "--allow-inactive to serve it anyway" in str(refused.value)


@pytest.mark.parametrize(
    ("target", "cpu", "lacks"),
    [
        ("zen", "sapphire-rapids", "vendor AuthenticAMD"),
        ("pace", "milan", "avx512f, avx512_bf16"),  # pace-vllm asks no vendor
    ],
)
def test_allow_inactive_plans_it_with_a_warning(target, cpu, lacks):
    host = flavor(8, 32, cpu=cpu)
    plan = make_plan(host, TINY, Policy(target=target, allow_inactive=True))
    # Sized and placed as vllm-openai would be: only the target's tuning env differs.
    assert [i.cpus for i in plan.instances] == [i.cpus for i in make_plan(host, TINY).instances]
    assert plan.warnings[0].startswith(f"target {target} needs {lacks}")
    assert "it would run without its acceleration" in plan.warnings[0]


def test_allow_inactive_adds_nothing_where_the_target_accelerates():
    plan = make_plan(flavor(8, 32), TINY, Policy(target="zen", allow_inactive=True))
    assert not [w for w in plan.warnings if "target zen" in w]


def test_zen_target_adds_its_tuning_env():
    plan = make_plan(synthetic_host("epyc-9454-24c-96g"), TINY, Policy(target="zen"))
    assert "TORCHINDUCTOR_FREEZING" not in plan.instances[0].env
    assert plan.instances[0].env["VLLM_ZENTORCH_WEIGHT_PREPACK"] == "1"


def test_memory_only_node_is_explained_not_used():
    host = flavor(8, 64, numa=1)
    cxl = dataclasses.replace(host.nodes[0], id=1, cpus=(), mem_total_bytes=256 * GIB)
    host = dataclasses.replace(host, nodes=(*host.nodes, cxl), allowed_mems=frozenset({0, 1}))
    plan = make_plan(host, TINY)
    assert {i.node for i in plan.instances} == {0}
    assert any("node 1 has 256.0 GiB but no CPUs" in n for n in plan.notes)


def test_explicit_kv_cache_below_the_minimum_is_refused_as_such():
    with pytest.raises(PlanError, match="--kv-cache-gib 0 is below the 1 GiB minimum"):
        make_plan(flavor(4, 64), TINY, Policy(kv_cache_gib=0))


def test_an_instance_count_is_kept_when_small_nodes_take_more_than_their_share():
    # Hypothesis found it: nodes of 4, 4, 1 and 1 usable cores and --instances 5. One
    # instance per node gave the small nodes more than their share (0.5 each) and the
    # largest-remainder step then added more instead of fewer: 8 instances, not 5.
    host = synthetic_host("vcpus=16,ram_gib=56,numa=4,smt=1,cpu=genoa")
    host = dataclasses.replace(host, allowed_cpus=frozenset({0, 1, 2, 3, 4, 5, 6, 7, 8, 12}))
    plan = make_plan(host, model_of_size(0.002), Policy(instances=5))
    assert len(plan.instances) == 5
    assert sorted(i.node for i in plan.instances) == [0, 0, 1, 2, 3]
    check_invariants(plan, host)
