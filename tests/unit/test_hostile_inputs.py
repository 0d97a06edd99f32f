"""A hostile-input sweep (hypothesis, a fixed budget): broken model directories,
mangled sysfs/procfs trees and absurd CLI numbers, through the real CLI in-process.

The rule for each: exit 0 with a plan, or exit 2 with `zenvllm VERB: error: ...` on
stderr and nothing on stdout; never a traceback (any other exception fails the
test with its own traceback). Derandomized, so CI runs the same examples each time.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.tiny_model import ensure_tiny_model

from zenvllm import cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "test-machine-zen4-2cpu"
SWEEP = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}
# Keys real configs carry that zenvllm reads or must survive (MoE, sliding window, MLA,
# quantization, multimodal nesting).
KEYS = [
    *LLAMA,
    "text_config",
    "num_local_experts",
    "num_experts_per_tok",
    "sliding_window",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "quantization_config",
    "dtype",
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(list(argv))
        except SystemExit as exit_:  # argparse's own refusals
            rc = exit_.code
    return rc, out.getvalue(), err.getvalue()


def assert_clean(rc: int, out: str, err: str, verb: str, ok=(0,)) -> None:
    assert rc in (*ok, 2), (rc, err)
    if rc == 2:
        assert out == "", out
        assert err.startswith((f"zenvllm {verb}: error: ", "usage: ")), err
        assert "Traceback" not in err


def safetensors(tensors: dict[str, tuple[int, int]]) -> bytes:
    header = {
        n: {"dtype": "BF16", "shape": [e - s], "data_offsets": [s, e]}
        for n, (s, e) in tensors.items()
    }
    raw = json.dumps(header).encode()
    data = max((e for _, e in tensors.values()), default=0)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * data


@st.composite
def weight_files(draw) -> bytes:
    good = safetensors({"a": (0, 64), "b": (64, 192)})
    kind = draw(st.sampled_from(["good", "truncated", "garbage", "length", "header", "offsets"]))
    if kind == "truncated":
        return good[: draw(st.integers(0, len(good) - 1))]
    if kind == "garbage":
        return draw(st.binary(max_size=64))
    if kind == "length":  # huge, or "negative" (the high bit of the u64 set)
        length = draw(
            st.sampled_from([2**63 + 5, 2**64 - 1, 10**15, 0]) | st.integers(0, 2**64 - 1)
        )
        return struct.pack("<Q", length) + good[8:]
    if kind == "header":
        raw = json.dumps(draw(json_values)).encode()
        return struct.pack("<Q", len(raw)) + raw
    if kind == "offsets":
        start, end = draw(json_values), draw(json_values)
        raw = json.dumps({"a": {"dtype": "BF16", "data_offsets": [start, end]}}).encode()
        return struct.pack("<Q", len(raw)) + raw + b"\0" * 64
    return good


@st.composite
def configs(draw) -> str:
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "not-an-object", "not-json"]))
    if kind == "not-json":
        return draw(st.text(max_size=20))
    if kind == "not-an-object":
        return json.dumps(draw(json_values))
    config = dict(LLAMA)
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=4, unique=True)):
        if draw(st.booleans()):
            config.pop(key, None)
        else:
            config[key] = draw(json_values)
    return json.dumps(config)


@st.composite
def model_dirs(draw) -> dict[str, bytes]:
    files = {"config.json": draw(configs()).encode()}
    layout = draw(st.sampled_from(["single", "sharded", "gguf-only", "no-weights"]))
    if layout == "single":
        files["model.safetensors"] = draw(weight_files())
    elif layout == "sharded":
        shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        present = draw(st.lists(st.sampled_from(shards), unique=True))
        for shard in present:
            files[shard] = draw(weight_files())
        weight_map = {f"t{i}": shard for i, shard in enumerate(shards)}
        files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    elif layout == "gguf-only":
        files["model-Q8_0.gguf"] = b"GGUF" + draw(st.binary(max_size=32))
    return files


@SWEEP
@given(files=model_dirs(), max_len=st.sampled_from([None, "512", "0", "-1", "99999999999"]))
def test_broken_model_directories_never_traceback(files, max_len):
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        argv = ["plan", "--flavor", "epyc-9454-24c-96g", "--model", tmp, "--json"]
        argv += ["--max-model-len", max_len] if max_len else []
        assert_clean(*run(*argv), "plan")


NUMBERS = (
    st.sampled_from(
        ["-1", "0", "nan", "NaN", "inf", "-inf", "1e308", "99999999999999999999", "0.5", "abc", ""]
    )
    | st.integers(min_value=-(2**66), max_value=2**66).map(str)
    | st.floats().map(str)
)
OPTIONS = [
    "--kv-cache-gib",
    "--kv-fraction",
    "--base-port",
    "--max-model-len",
    "--model-size-gib",
    "--instances",
]


@SWEEP
@given(option=st.sampled_from(OPTIONS), value=NUMBERS)
def test_absurd_cli_numbers_are_refused_by_name(option, value):
    argv = ["plan", "--flavor", "epyc-9454-24c-96g", f"{option}={value}"]
    if option != "--model-size-gib":
        argv += ["--model-size-gib", "4"]
    rc, out, err = run(*argv)
    assert_clean(rc, out, err, "plan")
    if rc == 2:
        # Refused by name (argparse), or by the planner with the numbers and the way out.
        assert option in err or value in err or re.search(r"\b(use|lower|give)\b", err, re.I), err


# Files of a host tree and what a mangled copy may hold instead.
GARBAGE = st.sampled_from(
    ["", "max", "-1", "0", "abc", "0-", "3-1", "99999999999999999999999", "1,,2", "\x00\xff"]
) | st.text(max_size=12)


@SWEEP
@given(data=st.data())
def test_mangled_sysfs_and_procfs_trees_never_traceback(data):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "host"
        shutil.copytree(FIXTURE, root, symlinks=True)
        files = sorted(p for p in root.rglob("*") if p.is_file())
        for path in data.draw(st.lists(st.sampled_from(files), max_size=4, unique=True)):
            if data.draw(st.booleans()):
                path.unlink()
            else:
                path.write_text(data.draw(GARBAGE))
        assert_clean(*run("plan", "--root", str(root), "--model-size-gib", "1"), "plan")
        assert_clean(*run("doctor", "--root", str(root)), "doctor", ok=(0, 1))


@pytest.mark.parametrize("option", ["--model", "--weights", "--out", "--compile-cache"])
def test_a_symlink_loop_is_refused_by_name(tmp_path, option):
    loop = tmp_path / "a"
    loop.symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(loop)
    model = ["--model", str(ensure_tiny_model())]
    given = {
        "--model": ["--model", str(loop)],
        "--weights": [*model, "--weights", f"int8={loop}"],
        "--out": [*model, "--out", str(loop)],
        "--compile-cache": [*model, "--compile-cache", str(loop)],
    }[option]
    rc, out, err = run("bench", "--dry-run", *given)
    assert_clean(rc, out, err, "bench")
    assert rc == 2 and str(loop) in err, err  # --out refuses any link it did not make
    assert "its links cannot be followed" in err or option == "--out", err
