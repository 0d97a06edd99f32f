"""The delivery's rules: which directory zenvllm may fill, which file it may replace."""

from __future__ import annotations

import pytest

from zenvllm.core import modelfiles
from zenvllm.core.gate import InputError
from zenvllm.core.modelfiles import Entry, Found, Marker, decide

A, B, C, X = (Entry(n, c * 64) for n, c in ((10, "a"), (20, "b"), (30, "c"), (5, "f")))
WANTED = {"config.json": A, "model.safetensors": B}


def found(files: dict, marker: Marker | None = None, exists: bool = True) -> Found:
    return Found(exists, frozenset(files), dict(files), marker)


def test_a_missing_or_empty_directory_is_claimed_and_filled():
    for where in (found({}, exists=False), found({})):
        steps = decide("/m", WANTED, where)
        assert steps.claim and steps.transfer == ("config.json", "model.safetensors")


def test_the_operators_identical_copy_is_used_as_it_is():
    steps = decide("/m", WANTED, found({**WANTED, "README.md": X}))
    assert steps.verified and steps.foreign and not steps.claim
    assert steps.extra == ("README.md",)


def test_the_operators_differing_copy_is_refused_naming_the_files():
    with pytest.raises(InputError) as err:
        decide("/srv/m", WANTED, found({"config.json": C}))
    says = str(err.value)
    assert "/srv/m holds files zenvllm did not write" in says
    assert "config.json holds 30 bytes, not 10" in says and "model.safetensors missing" in says


def test_a_verified_directory_needs_nothing():
    steps = decide("/m", WANTED, found(WANTED, Marker(WANTED, {})))
    assert steps.verified and not steps.claim and not steps.transfer


def test_a_new_version_replaces_only_zenvllms_files_and_drops_its_stale_shard():
    old = {"config.json": C, "model-1.safetensors": X}
    on_disk = {**old, "notes.txt": X}
    steps = decide("/m", {"config.json": A}, found(on_disk, Marker(old, {})))
    assert steps.transfer == ("config.json",) and steps.remove == ("model-1.safetensors",)
    assert steps.extra == ("notes.txt",)  # never recorded: the operator's, left alone


def test_a_file_changed_after_verification_is_refused():
    with pytest.raises(InputError, match=r"changed since zenvllm verified them: config\.json"):
        decide("/m", WANTED, found({"config.json": C, "model.safetensors": B}, Marker(WANTED, {})))
    # Changed and then dropped from the manifest: kept, not removed.
    steps = decide(
        "/m", {"model.safetensors": B}, found({**WANTED, "config.json": C}, Marker(WANTED, {}))
    )
    assert steps.remove == () and steps.verified


def test_a_file_of_a_cut_transfer_is_zenvllms_whatever_it_holds():
    marker = Marker({}, WANTED)
    steps = decide("/m", WANTED, found({"config.json": C}, marker))
    assert steps.transfer == ("config.json", "model.safetensors") and steps.claim


def test_claiming_keeps_what_is_verified_minus_what_goes():
    marker = modelfiles.claimed(Marker({"a": A, "b": B}, {}), {"a": C}, ("b",))
    assert marker == Marker({"a": A}, {"a": C})


@pytest.mark.parametrize(
    "path",
    [
        "../etc/passwd",
        "/etc/passwd",
        "a//b",
        "./a",
        "a/../b",
        ".zenvllm-model",
        ".zenvllm-partial/x",
        "d/.zenvllm-partial/x",
        "a\\b",
        "",
        "x" * 256,
    ],
)
def test_a_manifest_path_outside_the_directory_is_refused(path):
    with pytest.raises(InputError, match="not a relative path inside the model directory"):
        modelfiles.parse_manifest(modelfiles.manifest_text({path: A}), "m.json")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"files": {}}', "zenvllm_model_manifest is null, not 1"),
        ('{"zenvllm_model_manifest": 1, "files": {}}', "files is empty"),
        (
            '{"zenvllm_model_manifest": 1, "files": {"c": {"size": 1, "sha256": "ab"}}}',
            "not 64 hex digits",
        ),
        (
            '{"zenvllm_model_manifest": 1, "files": {"c": {"size": -1, "sha256": "'
            + "a" * 64
            + '"}}}',
            "size is -1, not a whole number",
        ),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_a_bad_manifest_names_its_fault_and_the_fix(text, says):
    with pytest.raises(InputError, match="zenvllm model manifest DIR") as err:
        modelfiles.parse_manifest(text, "m.json")
    assert says in str(err.value)


def test_a_manifest_round_trips():
    assert modelfiles.parse_manifest(modelfiles.manifest_text(WANTED), "m") == WANTED
    marker = Marker(WANTED, {"x": X})
    assert modelfiles.parse_marker(modelfiles.marker_text(marker), "mk") == marker
    assert modelfiles.parse_marker('{"something": "else"}', "mk") is None
