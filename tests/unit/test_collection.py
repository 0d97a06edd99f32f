"""The Ansible collection (ansible/ is its root) stands on its own: one version with the
Python package, no role reaching outside it, and the pins it repeats equal to the
compatibility matrix's. Building, installing and deploying it for real is
tests/ansible/test_nspawn.py's."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

import zenvllm
from zenvllm.core import compile_cache
from zenvllm.deploy import data, shipped
from zenvllm.image import render

REPO = Path(__file__).resolve().parents[2]
COLLECTION = REPO / "ansible"


def test_the_package_the_collection_and_the_changelog_share_one_version():
    galaxy = yaml.safe_load((COLLECTION / "galaxy.yml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert galaxy["version"] == project["version"] == zenvllm.__version__
    assert f"## [{zenvllm.__version__}]" in (REPO / "CHANGELOG.md").read_text()
    assert galaxy["license"] == [project["license"]] == ["Apache-2.0"]


def test_no_role_reaches_outside_the_collection():
    outside = re.compile(r"(\.\./){2,}|/scripts/|dockerfiles/build\.yaml'")
    offenders = [
        f"{path.relative_to(COLLECTION)}:{n}"
        for path in sorted((COLLECTION / "roles").rglob("*.yml"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if not line.lstrip().startswith("#") and outside.search(line)
    ]
    assert offenders == []


def test_the_router_pin_is_the_matrix_pin():
    pin = str(render.load_config()["fleet"]["vllm-router"]["version"])
    role = COLLECTION / "roles" / "zenvllm_router"
    default = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    option = spec["argument_specs"]["main"]["options"]["zenvllm_router_version"]
    assert str(default["zenvllm_router_version"]) == str(option["default"]) == pin


def test_the_package_reads_the_collection_it_ships():
    assert (data.ANSIBLE / "galaxy.yml").read_bytes() == (COLLECTION / "galaxy.yml").read_bytes()
    assert (data.ANSIBLE / "playbooks" / "deploy.yml").is_file()


def test_the_role_knows_the_planner_by_the_mark_the_package_writes():
    role_vars = COLLECTION / "roles" / "zenvllm_instances" / "vars" / "main.yml"
    assert yaml.safe_load(role_vars.read_text())["zenvllm_instances_planner_mark"] == shipped.MARK


def test_the_role_marks_the_compile_cache_as_the_package_names_it():
    role_vars = yaml.safe_load(
        (COLLECTION / "roles" / "zenvllm_instances" / "vars" / "main.yml").read_text()
    )
    assert role_vars["zenvllm_instances_compile_cache_mark_file"] == compile_cache.MARK_FILE
    assert role_vars["zenvllm_instances_compile_cache_mark"] == compile_cache.MARK


def test_the_two_roles_that_share_opt_zenvllm_mark_it_alike():
    """The instances and router roles both make /opt/zenvllm where it is missing, and
    whichever removes last takes it away by the other's mark too."""
    marks = {
        role: yaml.safe_load((COLLECTION / "roles" / role / "vars" / "main.yml").read_text())
        for role in ("zenvllm_instances", "zenvllm_router")
    }
    assert (
        marks["zenvllm_instances"]["zenvllm_instances_parent_marker"]
        == marks["zenvllm_router"]["zenvllm_router_parent_marker"]
    )
    assert (
        marks["zenvllm_instances"]["zenvllm_instances_parent_marker_text"]
        == marks["zenvllm_router"]["zenvllm_router_parent_marker_text"]
    )
