"""Flavor runs: the roles' detection pointed at the planner's fixture trees and
flavor presets, rendering env files and units for several VM sizes into a
temporary directory (one playbook run, one inventory host per flavor).

Each rendered file is checked against what `zenvllm plan --json` itself says
for the same input: the roles must render the plan, not compute their own.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES
from support.ansible_run import planner_zipapp, playbook
from support.cli import zenvllm

from zenvllm.deploy import shipped

pytestmark = pytest.mark.ansible

SECRET_KEY = "flavor-api-key-7c1e9d"
SECRET_TOKEN = "hf_flavor_token_52ab08"

# name: (planner input, model size GiB, instances, expected instance count)
FLAVORS = {
    "zen4-2cpu": (
        {"zenvllm_instances_sysfs_root": str(FIXTURES / "test-machine-zen4-2cpu")},
        0.5,
        2,
        2,
    ),
    "openstack-9454-24vcpu": (
        {"zenvllm_instances_sysfs_root": str(FIXTURES / "vm-openstack-9454-24vcpu")},
        16,
        "auto",
        None,
    ),
    "epyc-9354-2s-smt": (
        {"zenvllm_instances_sysfs_root": str(FIXTURES / "epyc-9354-2s-smt")},
        14,
        "auto",
        None,
    ),
    "epyc-9654-nps4": (
        {"zenvllm_instances_sysfs_root": str(FIXTURES / "epyc-9654-nps4")},
        14,
        "auto",
        None,
    ),
    "preset-9755-2s": ({"zenvllm_instances_flavor": "epyc-9755-2s-256c-3072g"}, 70, "auto", None),
}


def planner(args: list[str]) -> dict:
    proc = zenvllm("plan", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def planner_args(inputs: dict, size, count) -> list[str]:
    where = (
        ["--flavor", inputs["zenvllm_instances_flavor"]]
        if "zenvllm_instances_flavor" in inputs
        else ["--root", inputs["zenvllm_instances_sysfs_root"]]
    )
    return [
        *where,
        "--model-size-gib",
        str(size),
        "--instances",
        str(count),
        "--target",
        "vllm-openai",
    ]


def env_file(path) -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line and not line.startswith("#")
    )
    return dict(pairs)


def exec_start(unit_text: str) -> list[str]:
    """The ExecStart command line, continuation lines joined, split like systemd does."""
    body = unit_text.split("ExecStart=", 1)[1].split("\nExecStop=", 1)[0]
    return shlex.split(body.replace("\\\n", " "))


def instance_paths(root: Path) -> dict[str, str]:
    """Every path the instances role writes, under `root` instead of the host's."""
    return {
        "zenvllm_instances_config_dir": str(root / "etc"),
        "zenvllm_instances_unit_dir": str(root / "units"),
        "zenvllm_instances_lib_dir": str(root / "lib"),
        "zenvllm_instances_seccomp_profile": str(root / "etc" / "seccomp-numa.json"),
    }


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    base = tmp_path_factory.mktemp("flavors")
    planner_copy = planner_zipapp(base)
    hosts = {}
    for name, (inputs, size, count, _) in FLAVORS.items():
        dest = base / name
        (dest / "units").mkdir(parents=True)
        hosts[name] = {
            "ansible_connection": "local",
            **inputs,
            "zenvllm_instances_model_size_gib": size,
            "zenvllm_instances_count": count,
            **instance_paths(dest),
        }
    inventory = base / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"zenvllm": {"hosts": hosts}}))
    common = {
        "zenvllm_model_dir": "/srv/models/llm",
        "zenvllm_instances_render_only": True,
        "zenvllm_instances_supervisor": "systemd",
        "zenvllm_planner": str(planner_copy),
        "zenvllm_api_key": SECRET_KEY,
        "zenvllm_hf_token": SECRET_TOKEN,
    }
    run = playbook("-i", str(inventory), "--tags", "instances", extra_vars=common)
    assert run.rc == 0 and run.failed() == 0, run.output[-6000:]
    return base, run


@pytest.mark.parametrize("flavor", FLAVORS)
def test_env_files_and_units_render_the_plan(rendered, flavor):
    base, _ = rendered
    inputs, size, count, expected = FLAVORS[flavor]
    plan = planner(planner_args(inputs, size, count))
    if expected is not None:
        assert len(plan["instances"]) == expected
    dest = base / flavor
    envs = sorted((dest / "etc").glob("*.env"))
    units = sorted((dest / "units").glob("*.service"))
    assert [p.stem for p in envs] == sorted(i["name"] for i in plan["instances"])
    assert [p.stem for p in units] == sorted(i["name"] for i in plan["instances"])
    for instance in plan["instances"]:
        env_path = dest / "etc" / f"{instance['name']}.env"
        assert stat.S_IMODE(env_path.stat().st_mode) == 0o600
        env = env_file(env_path)
        for key, value in instance["env"].items():
            assert env[key] == value, (flavor, key)
        assert env["VLLM_CPU_KVCACHE_SPACE"] == str(instance["kv_cache_gib"])
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == instance["omp_threads_bind"]
        assert env["VLLM_API_KEY"] == SECRET_KEY and env["HF_TOKEN"] == SECRET_TOKEN

        args = exec_start((dest / "units" / f"{instance['name']}.service").read_text())
        assert args[:2] == ["/usr/bin/docker", "run"]
        for docker_arg in instance["docker_args"]:  # cpuset, mems, shm, memory: the plan's
            assert docker_arg in args, (flavor, docker_arg)
        assert "--cap-add=SYS_NICE" in args and "--cap-drop=ALL" in args
        assert f"--security-opt=seccomp={dest}/etc/seccomp-numa.json" in args
        assert not any("privileged" in a for a in args)
        assert "--network=host" in args and "--user=10001:10001" in args
        assert "--host=127.0.0.1" in args and f"--port={instance['port']}" in args
        assert "--volume=/srv/models/llm:/model:ro" in args
    assert (dest / "etc" / "seccomp-numa.json").is_file()


def test_bigger_hosts_get_more_instances(rendered):
    base, _ = rendered
    counts = {name: len(list((base / name / "units").glob("*.service"))) for name in FLAVORS}
    assert counts["epyc-9354-2s-smt"] >= 2  # at least one per NUMA node
    assert counts["epyc-9654-nps4"] >= 4
    assert counts["preset-9755-2s"] >= 2
    mems = {
        re.search(r"--cpuset-mems=(\S+)", (base / "epyc-9654-nps4" / "units" / u).read_text())[1]
        for u in os.listdir(base / "epyc-9654-nps4" / "units")
    }
    assert len(mems) >= 4  # each instance on its own node


def test_secrets_never_appear_in_ansible_output(rendered):
    _, run = rendered
    assert SECRET_KEY not in run.output and SECRET_TOKEN not in run.output


def test_an_impossible_plan_fails_with_the_planners_numbers(tmp_path):
    (tmp_path / "units").mkdir()
    run = playbook(
        "--tags",
        "instances",
        extra_vars={
            "zenvllm_model_dir": "/srv/models/huge",
            "zenvllm_instances_flavor": "epyc-9454-24c-96g",
            "zenvllm_instances_model_size_gib": 140,
            "zenvllm_instances_render_only": True,
            "zenvllm_instances_supervisor": "systemd",
            **instance_paths(tmp_path),
        },
        playbook_file="playbooks/deploy.yml",
    )
    assert run.rc != 0
    assert "The zenvllm planner refused" in run.output and "GiB" in run.output
    assert not list((tmp_path / "units").iterdir())


def test_a_copy_cut_over_two_hosts_takes_its_stages_from_inventory_order(tmp_path):
    """A model two hosts of the OpenStack blog's flavor hold together: deploy.yml gives
    the zenvllm group's first host the head's stage and the second the worker's joining
    it at the first's private address, with no per-host variable. A rolling batch of one
    host would restart half a copy: refused before anything is written."""
    addresses = {"stage-a": "10.231.9.1", "stage-b": "10.231.9.2"}
    hosts = {}
    for name, address in addresses.items():
        (tmp_path / name / "units").mkdir(parents=True)
        hosts[name] = {
            "ansible_connection": "local",
            "zenvllm_private_address": address,
            **instance_paths(tmp_path / name),
        }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"zenvllm": {"hosts": hosts}}))

    def deploy(**extra):
        return playbook(
            "-i",
            str(inventory),
            "--tags",
            "instances",
            extra_vars={
                "zenvllm_model_dir": "/srv/models/llm",
                "zenvllm_instances_flavor": "epyc-9454-24c-96g",
                "zenvllm_instances_model_size_gib": 140,
                "zenvllm_instances_hosts": 2,
                "zenvllm_instances_render_only": True,
                "zenvllm_instances_supervisor": "systemd",
                "zenvllm_planner": str(planner_zipapp(tmp_path)),
                **extra,
            },
            playbook_file="playbooks/deploy.yml",
        )

    refused = deploy(zenvllm_serial=1)
    assert refused.rc != 0
    said = " ".join(refused.output.split())
    assert "a pipeline changes as one unit" in said, refused.output[-3000:]
    assert "Give zenvllm_serial a multiple of 2" in said
    assert not [p for name in hosts for p in (tmp_path / name / "units").iterdir()]

    run = deploy()
    assert run.rc == 0 and run.failed() == 0, run.output[-6000:]
    head, worker = (
        exec_start((tmp_path / name / "units" / "zenvllm-0.service").read_text())
        for name in addresses
    )
    joined = {"--pipeline-parallel-size=2", "--nnodes=2", "--master-addr=10.231.9.1"}
    assert joined | {"--node-rank=0"} <= set(head) and "--headless" not in head
    assert joined | {"--node-rank=1", "--headless"} <= set(worker)


def test_the_planner_on_each_host_is_the_zipapp_and_only_the_shipped_layers(rendered):
    base, _ = rendered
    for name in FLAVORS:
        zipapp = base / name / "lib" / "zenvllm.pyz"
        assert zipapp.read_bytes() == (base / "zenvllm.pyz").read_bytes()
        assert shipped.is_ours(zipapp)
        names = zipfile.ZipFile(zipapp).namelist()
        assert "zenvllm/core/plan.py" in names
        assert not [n for n in names if n.startswith(("zenvllm/bench/", "zenvllm/image/"))]


def test_a_file_at_the_planners_path_zenvllm_did_not_write_is_refused_untouched(tmp_path):
    (tmp_path / "lib").mkdir()
    theirs = tmp_path / "lib" / "zenvllm.pyz"
    theirs.write_text("#!/bin/sh\n# the operator's own tool\n")
    run = render_one(tmp_path, "systemd")
    assert run.rc != 0
    assert f"{theirs} exists and zenvllm did not write it" in " ".join(run.output.split())
    assert theirs.read_text() == "#!/bin/sh\n# the operator's own tool\n"
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == ["zenvllm.pyz"]


def test_a_smaller_plan_prunes_the_files_of_dropped_instances(rendered):
    base, _ = rendered
    dest = base / "zen4-2cpu"
    assert (dest / "etc" / "zenvllm-1.env").exists()
    run = playbook(
        "-i",
        str(base / "inventory.yml"),
        "--limit",
        "zen4-2cpu",
        "--tags",
        "instances",
        extra_vars={
            "zenvllm_model_dir": "/srv/models/llm",
            "zenvllm_instances_render_only": True,
            "zenvllm_instances_supervisor": "systemd",
            "zenvllm_planner": str(base / "zenvllm.pyz"),
            "zenvllm_instances_count": 1,
        },
    )
    assert run.rc == 0 and run.failed() == 0, run.output[-4000:]
    assert sorted(p.name for p in (dest / "units").iterdir()) == ["zenvllm-0.service"]
    assert sorted(p.name for p in (dest / "etc").glob("*.env")) == ["zenvllm-0.env"]


def test_files_of_the_same_name_zenvllm_did_not_write_are_refused_untouched(tmp_path):
    units, etc = tmp_path / "units", tmp_path / "etc"
    units.mkdir()
    etc.mkdir()
    (units / "zenvllm-0.service").write_text("[Unit]\nDescription=the operator's own\n")
    (etc / "zenvllm-1.env").write_text("MINE=1\n")
    before = {p: p.read_bytes() for p in (*units.iterdir(), *etc.iterdir())}
    run = render_one(tmp_path, "systemd", zenvllm_instances_count=2)
    assert run.rc != 0
    # In the plan's order: each instance's env file, run script and unit.
    assert f"{units}/zenvllm-0.service, {etc}/zenvllm-1.env exist(s)" in run.output, run.output[
        -3000:
    ]
    assert "zenvllm_instances_deployment" in run.output
    # Refused before anything was written: the operator's files as they were, nothing else.
    assert {p: p.read_bytes() for p in (*units.iterdir(), *etc.iterdir())} == before


def test_a_gateway_port_an_instance_uses_is_refused(tmp_path):
    run = playbook(
        "--tags",
        "gateway",
        extra_vars={
            "zenvllm_gateway_listen": "127.0.0.1:8002",
            "zenvllm_gateway_upstreams": ["127.0.0.1:8001", "127.0.0.1:8002"],
            "zenvllm_gateway_site_path": str(tmp_path / "site.conf"),
        },
    )
    assert run.rc != 0
    assert "zenvllm_gateway_listen=127.0.0.1:8002 uses the port of an instance" in run.output
    assert not (tmp_path / "site.conf").exists()


def gateway_check(tmp_path, deployment: str, **extra):
    """The gateway role in check mode on loopback, its site file under tmp_path."""
    return playbook(
        "--check",
        "--tags",
        "gateway",
        extra_vars={
            "zenvllm_gateway_listen": "127.0.0.1:8443",
            "zenvllm_gateway_upstreams": ["127.0.0.1:8001"],
            "zenvllm_gateway_site_path": str(tmp_path / "site.conf"),
            "zenvllm_instances_deployment": deployment,
            **extra,
        },
    )


def test_a_tls_directory_zenvllm_did_not_make_is_refused_untouched(tmp_path):
    theirs = tmp_path / "ssl"
    theirs.mkdir()
    (theirs / "server.key").write_text("the operator's key\n")
    run = gateway_check(tmp_path, "zenvllm-tls-theirs", zenvllm_gateway_tls_dir=str(theirs))
    assert run.rc != 0
    assert f"{theirs} exists and zenvllm did not make it" in run.output, run.output[-3000:]
    assert [p.name for p in theirs.iterdir()] == ["server.key"]  # no marker, no pair
    assert (theirs / "server.key").read_text() == "the operator's key\n"
    assert not (tmp_path / "site.conf").exists()


def test_a_keys_directory_zenvllm_did_not_make_is_refused_untouched(tmp_path):
    keys = tmp_path / "secrets" / "keys"
    keys.mkdir(parents=True)
    (keys / "notes.txt").write_text("the operator's notes\n")
    run = gateway_check(
        tmp_path,
        "zenvllm-keys-theirs",
        zenvllm_gateway_tls_dir=str(tmp_path / "tls"),
        zenvllm_gateway_secrets_dir=str(tmp_path / "secrets"),
    )
    assert run.rc != 0
    assert f"{keys} holds files that are not zenvllm's keys (notes.txt)" in run.output, run.output[
        -3000:
    ]
    # Refused before any key was made: the operator's file alone, as it was.
    assert [p.name for p in keys.iterdir()] == ["notes.txt"]
    assert (keys / "notes.txt").read_text() == "the operator's notes\n"


def test_a_directory_of_the_old_planners_name_zenvllm_did_not_make_is_left_alone(tmp_path):
    """Releases before the zipapp installed lib/zenvllm/ with a marker: that one goes;
    an unmarked directory of that name is the operator's and stays as it is."""
    theirs = tmp_path / "lib" / "zenvllm"
    theirs.mkdir(parents=True)
    (theirs / "mine.py").write_text("print('the operator's module')\n")
    (tmp_path / "units").mkdir()
    run = render_one(tmp_path, "systemd")
    assert run.rc == 0 and run.failed() == 0, run.output[-3000:]
    assert [p.name for p in theirs.iterdir()] == ["mine.py"]
    assert shipped.is_ours(tmp_path / "lib" / "zenvllm.pyz")
    old = tmp_path / "old"
    (old / "lib" / "zenvllm" / "core").mkdir(parents=True)
    (old / "lib" / "zenvllm" / ".zenvllm-output").write_text("zenvllm planner\n")
    (old / "units").mkdir()
    run = render_one(old, "systemd")
    assert run.rc == 0 and run.failed() == 0, run.output[-3000:]
    assert sorted(p.name for p in (old / "lib").iterdir()) == ["zenvllm.pyz"]


def render_one(tmp_path, supervisor: str, **extra):
    return playbook(
        "--tags",
        "instances",
        extra_vars={
            "zenvllm_model_dir": "/srv/my models/llm",
            "zenvllm_instances_flavor": "epyc-9454-24c-96g",
            "zenvllm_instances_model_size_gib": 1,
            "zenvllm_instances_count": 1,
            "zenvllm_instances_render_only": True,
            "zenvllm_instances_supervisor": supervisor,
            "zenvllm_planner": str(planner_zipapp(tmp_path)),
            **instance_paths(tmp_path),
            **extra,
        },
    )


def test_a_model_path_with_spaces_reaches_the_container_as_one_argument(tmp_path):
    (tmp_path / "units").mkdir()
    run = render_one(tmp_path, "systemd")
    assert run.rc == 0 and run.failed() == 0, run.output[-3000:]
    unit = (tmp_path / "units" / "zenvllm-0.service").read_text()
    assert '"--volume=/srv/my models/llm:/model:ro"' in unit  # systemd's quoting
    run = render_one(tmp_path, "engine")
    assert run.rc == 0 and run.failed() == 0, run.output[-3000:]
    script = (tmp_path / "etc" / "zenvllm-0.run.sh").read_text()
    assert "'--volume=/srv/my models/llm:/model:ro'" in script  # the shell's


@pytest.mark.parametrize(
    ("variable", "value"),
    [("zenvllm_instances_base_port", "eighty"), ("zenvllm_instances_kv_cache_gib", [1])],
)
def test_a_variable_of_the_wrong_type_is_refused_by_name(tmp_path, variable, value):
    (tmp_path / "units").mkdir()
    run = render_one(tmp_path, "systemd", **{variable: value})
    assert run.rc != 0
    assert variable in run.output, run.output[-3000:]
    assert not (tmp_path / "etc").exists() and not list((tmp_path / "units").iterdir())


def test_undeploy_leaves_files_of_the_same_name_zenvllm_did_not_write(tmp_path):
    from support.engine import engine_env

    etc, units = tmp_path / "etc", tmp_path / "units"
    etc.mkdir()
    units.mkdir()
    name = "zenvllm-flv-theirs"  # no container on the engine carries it
    theirs = {
        etc / f"{name}-0.env": "MINE=1\n",
        etc / f"{name}-0.run.sh": "#!/bin/sh\necho mine\n",
        etc / "seccomp-numa.json": '{"defaultAction": "SCMP_ACT_ALLOW"}\n',
        units / f"{name}-0.service": "[Unit]\nDescription=the operator's own\n",
        # A planner directory without zenvllm's marker is not zenvllm's to remove.
        tmp_path / "lib" / "zenvllm" / "__init__.py": "# the operator's package\n",
    }
    for path, text in theirs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    run = render_one(
        tmp_path,
        "systemd",
        zenvllm_state="absent",
        zenvllm_instances_deployment=name,
        zenvllm_docker_host=engine_env()["DOCKER_HOST"],
    )
    assert run.rc == 0 and run.failed() == 0, run.output[-3000:]
    assert {p: p.read_text() for p in theirs} == theirs
    assert sorted(p.name for p in etc.iterdir()) == sorted(
        p.name for p in theirs if p.parent == etc
    )
