"""The router and monitoring roles take over and remove only what they made.

Their paths are variables (an operator may point them anywhere), so `absent`
removes a directory only with the role's marker in it and a file only with the
role's header, and the router refuses to install into a directory it did not
make. Run against this machine, on paths under the test's own directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.ansible_run import planner_zipapp, playbook

from zenvllm.core import compile_cache
from zenvllm.runtime import compile_dirs

pytestmark = pytest.mark.ansible


def run_tasks(tmp_path, tasks: list[tuple[str, str]], variables: dict, *args: str):
    play = [
        {
            "name": "Run role entry points on this machine",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": True,
            "gather_subset": ["!all", "min"],
            "tasks": [
                {
                    "name": f"{role} {entry}",
                    "ansible.builtin.include_role": {"name": role, "tasks_from": entry},
                }
                for role, entry in tasks
            ],
        }
    ]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    return playbook(*args, playbook_file=str(path), extra_vars=variables)


@pytest.fixture
def layout(tmp_path):
    """Paths of both roles under tmp_path, as the variables that point at them."""
    paths = {
        "venv": tmp_path / "router",
        "units": tmp_path / "units",
        "rules": tmp_path / "zenvllm.rules.yml",
        "dashboards": tmp_path / "grafana",
    }
    variables = {
        "zenvllm_router_venv": str(paths["venv"]),
        "zenvllm_router_unit_dir": str(paths["units"]),
        "zenvllm_router_name": "fleet-router",
        "zenvllm_monitoring_rules_path": str(paths["rules"]),
        "zenvllm_monitoring_dashboard_dir": str(paths["dashboards"]),
    }
    for directory in ("venv", "units", "dashboards"):
        paths[directory].mkdir()
    return paths, variables


def test_absent_keeps_what_the_roles_did_not_make(tmp_path, layout):
    paths, variables = layout
    foreign = {
        paths["venv"] / "bin-python": "an operator's venv\n",
        paths["units"] / "fleet-router.service": "[Service]\nExecStart=/bin/true\n",
        # Named as a model's router of this deployment, but another's by content.
        paths["units"] / "fleet-router-embed.service": "[Unit]\nX-Zenvllm-Router=fleet-router-x\n",
        paths["rules"]: "groups: []\n",
        paths["dashboards"] / "zenvllm-fleet.json": '{"uid": "theirs"}\n',
        paths["dashboards"] / "other.json": "{}\n",
    }
    for path, text in foreign.items():
        path.write_text(text)
    run = run_tasks(
        tmp_path, [("zenvllm_router", "absent"), ("zenvllm_monitoring", "absent")], variables
    )
    assert run.rc == 0, run.output[-3000:]
    assert {path: path.read_text() for path in foreign} == foreign


def test_absent_removes_what_the_roles_made(tmp_path, layout):
    paths, variables = layout
    (paths["venv"] / ".zenvllm-router").write_text("Made by zenvllm\n")
    (paths["units"] / "fleet-router.service").write_text(
        "# Ansible managed\n# vLLM's router in front of every zenvllm instance of the fleet.\n"
    )
    (paths["units"] / "fleet-router-embed.service").write_text(
        "# Ansible managed\n[Unit]\nX-Zenvllm-Router=fleet-router\n"
    )
    paths["rules"].write_text("# Ansible managed\n# zenvllm monitoring: rules\ngroups: []\n")
    (paths["dashboards"] / ".zenvllm-monitoring").write_text("Made by zenvllm\n")
    (paths["dashboards"] / "zenvllm-fleet.json").write_text('{\n  "uid": "zenvllm-fleet"\n}\n')
    run = run_tasks(
        tmp_path, [("zenvllm_router", "absent"), ("zenvllm_monitoring", "absent")], variables
    )
    assert run.rc == 0, run.output[-3000:]
    assert not paths["venv"].exists() and not paths["rules"].exists()
    assert not paths["dashboards"].exists()
    assert list(paths["units"].iterdir()) == []


def test_the_router_refuses_a_venv_it_did_not_make(tmp_path, layout):
    paths, variables = layout
    (paths["venv"] / "keep").write_text("an operator's file\n")
    run = run_tasks(tmp_path, [("zenvllm_router", "install")], variables)
    assert run.rc != 0
    assert f"{paths['venv']} or {paths['venv']}-wheels exists" in run.output
    assert "without zenvllm's marker" in run.output
    assert (paths["venv"] / "keep").read_text() == "an operator's file\n"
    assert sorted(p.name for p in paths["venv"].iterdir()) == ["keep"]


REGISTRY_IMAGE = "registry.invalid:5000/zenvllm/vllm-openai:0.32.0"


@pytest.fixture
def registry_paths(tmp_path):
    """The image role's registry CA file and login directory, under tmp_path (extra
    vars outrank the role's vars), with a CA of the operator's at both."""
    ca = tmp_path / "certs.d" / "registry.invalid:5000" / "ca.crt"
    ca.parent.mkdir(parents=True)
    ca.write_text("-----BEGIN CERTIFICATE-----\nthe operator's CA\n-----END CERTIFICATE-----\n")
    login = tmp_path / "registry-login"
    login.mkdir()
    (login / "config.json").write_text('{"auths": {"theirs": {}}}\n')
    ours = tmp_path / "ca.pem"
    ours.write_text("-----BEGIN CERTIFICATE-----\nzenvllm's CA\n-----END CERTIFICATE-----\n")
    variables = {
        "zenvllm_image": REGISTRY_IMAGE,
        "zenvllm_image_registry_ca_path": str(ca),
        "zenvllm_image_registry_config_dir": str(login),
        "zenvllm_image_registry_username": "puller",
        "zenvllm_image_registry_password": "not-logged",
    }
    return {"ca": ca, "login": login, "ours": ours}, variables


def snapshot(*roots: Path) -> dict[str, str]:
    return {str(p): p.read_text() for root in roots for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_image_role_refuses_a_ca_file_and_a_login_directory_it_did_not_make(
    tmp_path, registry_paths
):
    paths, variables = registry_paths
    before = snapshot(paths["ca"].parent, paths["login"])
    run = run_tasks(
        tmp_path,
        [("zenvllm_image", "registry_ca")],
        {**variables, "zenvllm_image_registry_ca": str(paths["ours"])},
    )
    assert run.rc != 0
    assert f"{paths['ca']} exists and zenvllm did not write it" in " ".join(run.output.split())
    run = run_tasks(tmp_path, [("zenvllm_image", "registry_login")], variables)
    assert run.rc != 0
    assert f"{paths['login']} exists and zenvllm did not make it" in " ".join(run.output.split())
    assert "not-logged" not in run.output
    assert snapshot(paths["ca"].parent, paths["login"]) == before


def test_the_image_roles_absent_keeps_a_ca_file_and_a_login_it_did_not_make(
    tmp_path, registry_paths
):
    paths, variables = registry_paths
    before = snapshot(paths["ca"].parent, paths["login"])
    run = run_tasks(tmp_path, [("zenvllm_image", "absent")], variables)
    assert run.rc == 0 and run.failed() == 0, run.output[-3000:]
    assert snapshot(paths["ca"].parent, paths["login"]) == before


def compile_cache_vars(tmp_path, root, dirs: list[str]) -> dict:
    """The compile cache task file's inputs: the planner zipapp under tmp_path (it runs
    the step), ROOT, and a plan whose instances keep their caches in dirs."""
    planner_zipapp(tmp_path)
    return {
        "zenvllm_instances_lib_dir": str(tmp_path),
        "zenvllm_instances_compile_cache_dir": str(root),
        "zenvllm_instances_plan": {"instances": [{"container": {"cache_dir": d}} for d in dirs]},
    }


def test_the_instances_role_refuses_a_compile_cache_directory_it_did_not_make(tmp_path):
    theirs = tmp_path / "cache"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("an operator's files\n")
    variables = compile_cache_vars(tmp_path, theirs, [str(theirs / "site-0" / ("a" * 16))])
    run = run_tasks(tmp_path, [("zenvllm_instances", "compile_cache")], variables)
    said = " ".join(run.output.split())  # the result's stderr, folded by the yaml callback
    assert run.rc != 0
    assert f"{theirs} exists and zenvllm did not make it" in said, said[-3000:]
    assert "zenvllm_instances_compile_cache_dir another path" in said
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]


def test_the_instances_role_makes_the_compile_caches_then_changes_nothing(tmp_path):
    """ROOT root's with its mark, each key's directory the container user's (0700); a
    check-mode run first writes nothing and says it would, a second run changes nothing."""
    root = tmp_path / "compile"
    keys = [root / f"site-{n}" / ("a" * 16) for n in (0, 1)]
    variables = compile_cache_vars(tmp_path, root, [str(k) for k in keys])
    task = [("zenvllm_instances", "compile_cache")]
    check = run_tasks(tmp_path, task, variables, "--check")
    assert check.rc == 0 and check.changed() == 1, check.output[-3000:]
    assert not root.exists()
    made = run_tasks(tmp_path, task, variables)
    assert made.rc == 0 and made.changed() == 1, made.output[-3000:]
    assert (root / compile_cache.MARK_FILE).read_text() == compile_dirs.MARK_TEXT
    assert (root.stat().st_mode & 0o777, root.stat().st_uid) == (0o755, 0)
    for key in keys:
        assert (key.stat().st_mode & 0o777, key.stat().st_uid, key.stat().st_gid) == (
            0o700,
            10001,
            10001,
        )
    again = run_tasks(tmp_path, task, variables)
    assert again.rc == 0 and again.changed() == 0, again.output[-3000:]


def test_the_instances_role_refuses_a_status_timer_it_did_not_write(tmp_path):
    units = tmp_path / "units"
    units.mkdir()
    theirs = units / "zenvllm-status.timer"
    theirs.write_text("# the operator's own timer\n[Timer]\nOnCalendar=daily\n")
    variables = {"zenvllm_instances_unit_dir": str(units)}
    run = run_tasks(tmp_path, [("zenvllm_instances", "status")], variables)
    assert run.rc != 0
    assert f"{theirs} on localhost is not zenvllm's" in " ".join(run.output.split())
    assert sorted(p.name for p in units.iterdir()) == ["zenvllm-status.timer"]
    assert theirs.read_text() == "# the operator's own timer\n[Timer]\nOnCalendar=daily\n"


def test_the_monitoring_role_refuses_an_alertmanager_it_did_not_install(tmp_path):
    """An Alertmanager configured before zenvllm came is the operator's: refused before
    anything is installed or written, its files as they were."""
    theirs = tmp_path / "alertmanager.yml"
    text = "# the operator's own\nroute: {receiver: pager}\nreceivers: [{name: pager}]\n"
    theirs.write_text(text)
    variables = {
        "zenvllm_monitoring_alertmanager_config_path": str(theirs),
        "zenvllm_monitoring_alertmanager_args_path": str(tmp_path / "default"),
        "zenvllm_monitoring_installed_dir": str(tmp_path / "installed"),
        "zenvllm_monitoring_alert_webhooks": ["https://hooks.example.org/zenvllm"],
    }
    run = run_tasks(tmp_path, [("zenvllm_monitoring", "alertmanager")], variables)
    assert run.rc != 0
    said = " ".join(run.output.split())
    assert f"{theirs} on localhost is not zenvllm's and zenvllm did not install" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alertmanager.yml", "play.yml"]
    assert theirs.read_text() == text


def test_the_gateway_adds_njs_only_to_an_nginx_zenvllm_installed(tmp_path):
    """Several models need nginx's njs module. On an nginx that was there before zenvllm
    (no record of installing it, or a record zenvllm did not write) the role refuses
    before installing or writing anything; with zenvllm's record it goes on to install.
    The server package is `dpkg` here, installed on every Debian host, as an operator's
    nginx would be; the module a name no archive has, so nothing is ever installed."""
    records = tmp_path / "installed"
    variables = {
        "zenvllm_gateway_models": [
            {"served_name": "chat", "urls": ["127.0.0.1:8001"]},
            {"served_name": "embed", "urls": ["127.0.0.1:8002"]},
        ],
        "zenvllm_gateway_packages": ["dpkg"],
        "zenvllm_gateway_nginx_package": "dpkg",
        "zenvllm_gateway_njs_packages": ["zenvllm-test-no-such-njs"],
        "zenvllm_gateway_installed_dir": str(records),
    }
    refusal = "need nginx's njs module (zenvllm-test-no-such-njs)"
    for record in (None, "mine\n"):
        if record is not None:
            records.mkdir(exist_ok=True)
            (records / "dpkg").write_text(record)
        run = run_tasks(tmp_path, [("zenvllm_gateway", "install")], variables)
        said = " ".join(run.output.split())
        assert run.rc != 0 and refusal in said, said[-3000:]
        assert "apt-get install zenvllm-test-no-such-njs" in said
        assert "Install nginx from the distribution" not in said
        assert sorted(p.name for p in records.glob("*")) == ([] if record is None else ["dpkg"])
    (records / "dpkg").write_text("Installed by zenvllm's gateway role; state=absent leaves it.\n")
    run = run_tasks(tmp_path, [("zenvllm_gateway", "install")], variables)
    said = " ".join(run.output.split())
    assert refusal not in said and "Install nginx from the distribution" in said, said[-3000:]
    assert run.rc != 0  # apt has no such module: nothing installed, nothing recorded
    assert sorted(p.name for p in records.iterdir()) == ["dpkg"]


def test_pruning_compile_caches_removes_only_this_deployments_stale_keys(tmp_path):
    """Older keys and unplanned instances of this deployment go; the current key, other
    deployments' caches and names that only look alike stay."""
    root = tmp_path / "compile"
    keep = root / "site-0" / ("b" * 16)
    stale = [root / "site-0" / ("a" * 16), root / "site-5" / ("c" * 16)]
    stays = [keep, root / "site-other-0" / ("d" * 16), root / "site-0x" / ("e" * 16)]
    for path in stale + stays:
        path.mkdir(parents=True)
        (path / "kernel.so").write_text("x")
    variables = {
        "zenvllm_instances_compile_cache_dir": str(root),
        "zenvllm_instances_deployment": "site",
        "zenvllm_instances_cache_keep": [str(keep)],
    }
    run = run_tasks(tmp_path, [("zenvllm_instances", "compile_cache_prune")], variables)
    assert run.rc == 0, run.output[-3000:]
    assert [p.exists() for p in stale] == [False, False]
    assert [p.exists() for p in stays] == [True, True, True]
    assert not (root / "site-5").exists() and (root / "site-0").exists()
