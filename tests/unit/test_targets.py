"""The targets are defined once (core/targets.py); every list of them must agree."""

from __future__ import annotations

from pathlib import Path

import yaml

from zenvllm.core.targets import TARGETS
from zenvllm.image import render

REPO = Path(__file__).resolve().parents[2]


def spec_choices(role: str, option: str) -> list[str]:
    path = REPO / "ansible" / "roles" / role / "meta" / "argument_specs.yml"
    return yaml.safe_load(path.read_text())["argument_specs"]["main"]["options"][option]["choices"]


def test_build_yaml_builds_exactly_the_targets_the_planner_knows():
    assert list(render.load_config()["targets"]) == list(TARGETS)


def test_the_roles_argument_specs_offer_exactly_the_targets():
    # Ansible cannot import Python, so the specs list them; this keeps them equal.
    assert spec_choices("zenvllm_instances", "zenvllm_instances_target") == list(TARGETS)
    assert spec_choices("zenvllm_image", "zenvllm_image_build_target") == list(TARGETS)
