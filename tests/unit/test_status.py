"""`zenvllm status`'s verdicts (core/observed.py) and view, on what /proc, the engine
and vLLM really print. The live view of a deployed host: tests/ansible/test_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zenvllm.core import observed
from zenvllm.core.errors import UserError
from zenvllm.core.observed import Planned, Seen
from zenvllm.core.topology import read_host
from zenvllm.runtime import commands_status, status

# Two lines of a real /proc/PID/numa_maps (a vLLM worker on node 0, one page on node 1).
NUMA_MAPS = """\
7f3a2c000000 default anon=65536 dirty=65536 active=0 N0=65535 N1=1 kernelpagesize_kB=4
7f3a3c600000 default file=/usr/lib/libtorch.so mapped=12000 N0=12000 kernelpagesize_kB=4
7f3a40000000 default file=/dev/shm/psm_1 dirty=3
"""
STATUS = (
    "Name:\tVLLM::EngineCor\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n"
)
FIXTURES = Path(__file__).parents[1] / "fixtures" / "hosts"
PLAN = Planned(name="site-a-0", target="zen", cpus=frozenset({0, 1}), mems=frozenset({0}))


def test_the_proc_files_are_read_as_the_kernel_writes_them():
    assert observed.cpus_allowed(STATUS) == {0, 1}
    assert observed.pages_per_node(NUMA_MAPS) == {0: 77535, 1: 1}
    assert observed.local_ratio({0: 90, 1: 10}, frozenset({0})) == 0.9
    assert observed.local_ratio({}, frozenset({0})) is None


def test_an_instance_as_planned_has_no_problem():
    seen = Seen(
        cpus=frozenset({0, 1}),
        mems=frozenset({0}),
        threads={"1/1 python3": frozenset({0, 1}), "1/9 python3": frozenset({1})},
        pages={0: 1000},
        platform="ZenCpuPlatform",
    )
    assert observed.problems(PLAN, seen) == []


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"cpus": frozenset({0, 1, 2, 3})}, "cpuset 0-3 is not the planned 0-1"),
        ({"mems": frozenset({1})}, "memory nodes 1 are not the planned 0"),
        ({"mems": frozenset()}, "memory nodes unrestricted are not the planned 0"),
        ({"threads": {"1/7 kv-connector": frozenset({5})}}, "1/7 kv-connector on 5"),
        ({"pages": {0: 60, 1: 40}}, "60% of resident memory is on node 0"),
        ({"platform": "CpuPlatform"}, "vLLM runs CpuPlatform (stock), not the zen target's"),
    ],
)
def test_each_drift_is_named_with_its_values(change, says):
    base = {"cpus": frozenset({0, 1}), "mems": frozenset({0}), "pages": {0: 1}}
    problems = observed.problems(PLAN, Seen(**(base | change)))
    assert len(problems) == 1 and says in problems[0], problems


def test_the_containers_labels_are_the_plan_and_its_args_where_it_listens():
    info = {
        "Name": "/site-a-0",
        "Args": ["--model=/model", "--host=10.0.0.5", "--port=8001"],
        "Config": {
            "Labels": {
                "zenvllm.instance": "site-a-0",
                "zenvllm.target": "zen",
                "zenvllm.cpus": "0-1",
                "zenvllm.mems": "0",
                "zenvllm.port": "8001",
            }
        },
    }
    assert status.planned(info) == PLAN
    assert status.listen(info) == ("10.0.0.5", 8001)
    assert status.stage(info) == ""


def test_a_stage_of_a_copy_cut_over_hosts_is_seen_at_its_head():
    group = ["--nnodes=2", "--master-addr=10.0.0.4", "--master-port=29500"]
    head = {"Args": ["--host=10.0.0.4", *group, "--node-rank=0"], "Config": {"Labels": {}}}
    worker = {
        "Args": ["--host=10.0.0.5", *group, "--node-rank=1", "--headless"],
        "Config": {"Labels": {"zenvllm.port": "8001"}},
    }
    assert (status.stage(head), status.stage(worker)) == ("0/2", "1/2")
    assert status.listen(worker) == ("10.0.0.4", 8001)  # its group's health is its head's


def row(**change) -> dict:
    base = {
        "host": "llm-a",
        "deployment": "site-a",
        "target": "zen",
        "platform": "ZenCpuPlatform",
        "numa_local_ratio": 0.97,
        "name": "site-a-0",
        "cpus": [0, 1],
        "node": [0],
        "backend": "zentorch",
        "placement": "ok",
        "problems": [],
        "health": "ok",
        "running": 2.0,
        "waiting": 0.0,
        "tokens_per_s": 35.5,
        "model": "qwen",
        "url": "http://10.0.0.5:8001",
        "router": None,
    }
    return base | change


def test_the_view_is_one_line_per_instance_then_each_problem():
    drifted = row(
        name="site-a-1", cpus=[0, 1, 2], backend="", placement="drifted", problems=["cpuset 0-2"]
    )
    lines = commands_status.render([row(), drifted]).splitlines()
    assert lines[0].split() == list(commands_status.COLUMNS)
    assert lines[1].split() == [
        "llm-a",
        "site-a-0",
        "0-1",
        "0",
        "zentorch",
        "ok",
        "ok",
        "-",
        "2",
        "0",
        "35.5",
    ]
    assert lines[2].split()[:6] == ["llm-a", "site-a-1", "0-2", "0", "-", "drifted"]
    assert lines[3] == "site-a-1: cpuset 0-2"
    assert commands_status.render([]) == "no zenvllm instances"


def test_the_metrics_say_placement_locality_health_and_backend_per_instance():
    drifted = row(name="site-a-1", placement="drifted", problems=["a", "b"], platform="")
    text = commands_status.exposition([row(), drifted])
    where = 'model_name="qwen",vllm_instance="10.0.0.5:8001"'
    one = f'deployment="site-a",zenvllm_instance="site-a-0",target="zen",{where}'
    two = f'deployment="site-a",zenvllm_instance="site-a-1",target="zen",{where}'
    for line in (
        f"zenvllm_placement_ok{{{one}}} 1",
        f"zenvllm_placement_ok{{{two}}} 0",
        f"zenvllm_placement_problems{{{two}}} 2",
        f"zenvllm_numa_local_ratio{{{one}}} 0.97",
        f"zenvllm_instance_healthy{{{one}}} 1",
        f'zenvllm_backend_info{{{one},backend="zentorch",platform="ZenCpuPlatform"}} 1',
    ):
        assert line in text.splitlines(), line
    assert "site-a-1" not in text.split("zenvllm_backend_info")[-1]  # not asked: no series


def test_the_textfile_replaces_only_its_own_file(tmp_path):
    path = tmp_path / "zenvllm.prom"
    text = commands_status.exposition([row()])
    commands_status.write_textfile(path, text)
    commands_status.write_textfile(path, text.replace(" 0.97", " 0.5"))
    assert "} 0.5" in path.read_text()
    theirs = tmp_path / "node.prom"
    theirs.write_text("# HELP node_custom theirs\n")
    with pytest.raises(UserError, match="not one zenvllm status wrote"):
        commands_status.write_textfile(theirs, text)
    assert theirs.read_text() == "# HELP node_custom theirs\n"


def test_the_platform_cache_is_read_only_from_a_file_it_wrote(tmp_path):
    path = tmp_path / "status-platforms.json"
    assert commands_status.platforms(path) == {}  # none yet
    path.write_text(json.dumps(commands_status.CACHE_MARK | {"abc@t0": "CpuPlatform"}))
    assert commands_status.platforms(path) == {"abc@t0": "CpuPlatform"}
    theirs = tmp_path / "theirs.json"
    theirs.write_text('{"abc@t0": "CpuPlatform"}')  # strings, but not zenvllm's
    with pytest.raises(UserError, match="not a platform cache zenvllm status wrote"):
        commands_status.platforms(theirs)
    assert theirs.read_text() == '{"abc@t0": "CpuPlatform"}'


# vLLM 0.32's /metrics, cut down: two series of one gauge, a counter, and lines to skip.
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny-llama"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0
vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 1234.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
vllm:num_requests_waiting{engine="1",model_name="tiny-llama"} NaN
"""


def test_the_metrics_are_summed_and_name_the_model(monkeypatch):
    import io

    monkeypatch.setattr(
        status.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(METRICS.encode())
    )
    values, model = status.metrics("10.0.0.5", 8001)
    assert values == {status.RUNNING: 3.0, status.WAITING: 0.0, status.TOKENS: 1234.0}
    assert model == "tiny-llama"


# vllm-router 0.1.17's GET /workers, as the router role's wait reads it.
WORKERS = {
    "workers": [
        {"url": "http://10.0.0.5:8001", "is_healthy": True, "load": 0},
        {"url": "http://10.0.0.6:8001/", "is_healthy": False, "load": 3},
    ]
}


def test_the_router_view_says_whether_it_sends_each_instance_requests():
    view = observed.router_view(WORKERS, "fix")
    assert view == {"http://10.0.0.5:8001": True, "http://10.0.0.6:8001": False}
    assert observed.in_router("http://10.0.0.5:8001", view) == "healthy"
    assert observed.in_router("http://10.0.0.6:8001", view) == "unhealthy"
    assert observed.in_router("http://10.0.0.7:8001", view) == "not listed"
    for bad in ({}, {"workers": "all"}, {"workers": [{"url": 5}]}, []):
        with pytest.raises(UserError, match="the router's /workers answer"):
            observed.router_view(bad, "fix")
    with pytest.raises(UserError, match="'file:///etc/passwd' is not an http"):
        status.workers("file:///etc/passwd")


def run_status(*argv: str) -> int:
    from zenvllm.runtime import console

    return console.run((commands_status,), ["status", *argv])


def test_the_fleet_view_is_the_hosts_rows_and_the_routers_workers(tmp_path, capsys):
    other = row(host="llm-b", name="site-a-0", url="http://10.0.0.6:8001", problems=["x"])
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"rows": [row(), other], "workers": WORKERS}))
    assert run_status("--from", str(path)) == 1  # llm-b's instance is out of the router
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] + line.split()[7:8] for line in lines[1:3]] == [
        ["llm-a", "site-a-0", "healthy"],
        ["llm-b", "site-a-0", "unhealthy"],
    ]
    assert lines[3:] == ["llm-b site-a-0: x"]  # two hosts' instances share a name
    bare = {k: v for k, v in row().items() if k not in ("router", "running", "tokens_per_s")}
    path.write_text(json.dumps({"rows": [bare], "workers": None}))
    assert run_status("--from", str(path)) == 0  # what a row may lack shows as "-"
    assert capsys.readouterr().out.splitlines()[1].split()[7:] == ["-", "-", "0", "-"]
    assert run_status("--from", str(path), "--textfile", str(tmp_path / "x.prom")) == 2
    assert "--textfile is each host's own" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"rows": {}}, "rows is {}, not a list"),
        ({"rows": [row(cpus="0-1")]}, 'rows[0].cpus is "0-1"'),
        ({"rows": [row(cpus=[-1])]}, "rows[0].cpus is -1"),
        ({"rows": [row(running="many")]}, 'rows[0].running is "many"'),
        ({"rows": [row()], "workers": {"workers": 1}}, "the router's /workers answer"),
    ],
)
def test_a_fleet_file_that_is_not_rows_is_refused_with_the_fix(tmp_path, capsys, doc, says):
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(doc))
    assert run_status("--from", str(path)) == 2
    err = capsys.readouterr().err
    assert says in err and "status playbook" in err.replace("status --json", ""), err


def test_the_amx_permission_is_read_back_from_the_launchers_line():
    from zenvllm.runtime import amx

    lines = {
        "granted": amx.describe(amx.AmxState(True, True, ""), True, True),
        "refused": amx.describe(amx.AmxState(True, False, "EPERM"), True, True),
        "none": amx.describe(amx.AmxState(False, False, ""), False, True),
        "no kernel support": amx.describe(amx.AmxState(False, False, ""), True, True),
    }
    for word, line in lines.items():
        log = f"INFO vllm starting\nzenvllm-launch: {line}\nINFO more\n"
        assert amx.verdict(log) == word, line
    assert amx.verdict("no launcher here") == ""
    problems = observed.problems(PLAN, Seen(cpus=PLAN.cpus, mems=PLAN.mems, amx="refused"))
    assert problems == [
        "AMX tile permission refused at launch: vLLM's AMX kernels die with 'Illegal "
        "instruction' (its log says why)"
    ]
    text = commands_status.exposition([row(amx="granted"), row(name="site-a-1", amx="none")])
    assert [line for line in text.splitlines() if line.startswith("zenvllm_amx_granted{")] == [
        'zenvllm_amx_granted{deployment="site-a",zenvllm_instance="site-a-0",target="zen",'
        'model_name="qwen",vllm_instance="10.0.0.5:8001"} 1'
    ]


def test_what_holds_for_a_container_start_is_asked_once_per_start():
    asked = []

    def ask(info):
        asked.append(info["Id"])
        return {"a": "ZenCpuPlatform", "b": None}[info["Id"]]

    def info(cid, started="t0"):
        return {"Id": cid, "State": {"StartedAt": started}}

    cache: dict[str, str] = {}
    for _ in range(2):
        assert status.per_start(info("a"), cache, " x", ask) == "ZenCpuPlatform"
        assert status.per_start(info("b"), cache, " x", ask) == ""  # no answer: asked again
    assert asked == ["a", "b", "b"] and cache == {"a@t0 x": "ZenCpuPlatform"}
    status.per_start(info("a", "t1"), cache, " x", ask)  # restarted: asked again
    status.per_start(info("a"), None, " x", ask)  # no cache: asked every time
    assert asked[3:] == ["a", "a"]


@pytest.mark.parametrize(
    ("tree", "name", "gen", "isa"),
    [
        ("vm-milan-8vcpu-avx2", "Zen 3", "Zen 3", ["avx2"]),
        ("test-machine-zen4-2cpu", "(Zen 4)", "Zen 4", ["avx2", "avx512_bf16", "avx512f"]),
        ("xeon-8480-spr-amx", "Sapphire Rapids", "Sapphire Rapids", ["amx_bf16", "amx_tile"]),
    ],
)
def test_each_host_is_named_with_its_generation_and_isa(tree, name, gen, isa):
    cpu = status.this_cpu(FIXTURES / tree)
    assert name in cpu["cpu"] and cpu["generation"] == gen, cpu
    assert set(isa) <= set(cpu["isa"]), cpu
    if isa == ["avx2"]:
        assert cpu["isa"] == ["avx2"]  # nothing wider on an AVX2-only EPYC


def test_this_machine_is_named_as_its_plan_names_it():
    host = read_host()
    assert status.this_cpu() == {
        "cpu": host.cpu_name,
        "generation": host.generation,
        "isa": sorted(host.isa),
    }


def test_the_view_and_the_metrics_carry_each_hosts_cpu():
    zen4 = {"cpu": "AMD EPYC (Zen 4)", "generation": "Zen 4", "isa": ["avx2", "avx512_bf16"]}
    zen3 = {"cpu": "AMD EPYC (Zen 3)", "generation": "Zen 3", "isa": ["avx2"]}
    rows = [row(**zen4), row(name="site-a-1", **zen4), row(host="llm-b", **zen3)]
    lines = commands_status.render(rows).splitlines()
    assert lines[:2] == [
        "llm-a: AMD EPYC (Zen 4); avx2 avx512_bf16",
        "llm-b: AMD EPYC (Zen 3); avx2",
    ]
    assert lines[2].split() == list(commands_status.COLUMNS)
    info = [x for x in commands_status.exposition(rows).splitlines() if "zenvllm_host_info{" in x]
    assert info == [
        'zenvllm_host_info{cpu="AMD EPYC (Zen 4)",generation="Zen 4",isa="avx2 avx512_bf16"} 1',
        'zenvllm_host_info{cpu="AMD EPYC (Zen 3)",generation="Zen 3",isa="avx2"} 1',
    ]


@pytest.mark.parametrize(
    ("change", "says"),
    [({"cpu": 4}, "rows[0].cpu is 4"), ({"isa": "avx2"}, 'rows[0].isa is "avx2"')],
)
def test_a_fleet_row_with_a_cpu_that_is_not_text_is_refused(tmp_path, capsys, change, says):
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"rows": [row(**change)]}))
    assert run_status("--from", str(path)) == 2
    assert says in capsys.readouterr().err
