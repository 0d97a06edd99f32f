"""A fuzz campaign over every reader and path option (hypothesis strategies).

For each place outside bytes enter (a model's config, safetensors header and shard
index, a calibration file, sysfs/procfs/cgroup files under --root, --request,
ZENVLLM_SECRETS and ZENVLLM_PLAN, a template override, render --output, calibrate --out,
--metrics-file, a flavor) it generates the classes issue 27 found: special files
(FIFO, directory, device, sparse GBs), stray bytes, nesting, magnitudes and wrong
nested types, spliced into a valid input. The rule for every one: exit 0, or exit 2
with `zenvllm VERB: error: ...` and nothing on stdout; never an exception, never a
hang (SIGALRM fails a run after 10 s).

`make test-fast` runs a fixed, derandomized budget; `make fuzz` a longer random one
(ZENVLLM_FUZZ_EXAMPLES, ZENVLLM_FUZZ_RANDOM=1). The corpus in tests/fuzz/corpus/TARGET/
is replayed every run: each crash found becomes a file there.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.hostile import LLAMA_CONFIG, special_file

from zenvllm import cli
from zenvllm.core import deployed
from zenvllm.core.errors import UserError

TESTS = Path(__file__).resolve().parents[1]
ZEN4 = TESTS / "fixtures" / "hosts" / "test-machine-zen4-2cpu"
CGROUP2 = TESTS / "fixtures" / "hosts" / "container-cgroup2-cpuset4-7"
CORPUS = TESTS / "fuzz" / "corpus"
FUZZ = settings(
    max_examples=int(os.environ.get("ZENVLLM_FUZZ_EXAMPLES", "20")),
    deadline=None,
    derandomize=os.environ.get("ZENVLLM_FUZZ_RANDOM") != "1",
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CONFIG = {
    **LLAMA_CONFIG,
    "quantization_config": {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"num_bits": 8}, "input_activations": {}}},
    },
}
HEADER = {"w": {"dtype": "BF16", "shape": [32], "data_offsets": [0, 64]}}
CALIBRATION = {
    "format": 1,
    "cpu_model": "AMD EPYC",
    "cpus": 2,
    "measured_at": "2026-11-24T00:00:00Z",
    "method": "copy",
    "core_alone_gbs": 10.0,
    "nodes": {"0": {"cores": 2, "gbs": 20.0}},
    "steps": [{"model": "m", "weight_bytes": 64, "cores": 2, "ms": 1.5}],
}
SETTINGS = {"image": "i", "serve_args": ["--dtype=bfloat16"], "extra_env": {"A": "b"}}
PROMISE = {"name": "a", "target": "zen", "cpus": "0-1", "mems": "0", "shm_mib": 1, "memory_mib": 2}

# ---------------------------------------------------------------- strategies

HOSTILE = [
    "1e400",
    "-1e400",
    "NaN",
    "-Infinity",
    "9" * 5000,
    "-0",
    "0",
    "1e-320",
    "[" * 70 + "]" * 70,
    "[" * 50_000 + "]" * 50_000,
    '{"a":' * 70 + "1" + "}" * 70,
    '"\\ud800"',
    "true",
    "null",
    '""',
    "[]",
    "{}",
    '"32"',
    "[1, 2, 3]",
    "18446744073709551616",
]


def paths_in(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every key path into a JSON value (the root too)."""
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += paths_in(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += paths_in(v, (*prefix, i))
    return found


def splice(valid: object, path: tuple, raw: str) -> str:
    """`valid` as JSON text with the value at `path` replaced by the raw text `raw`."""
    marker = "\x00HOSTILE\x00"
    if not path:
        return raw
    copy = json.loads(json.dumps(valid))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = marker
    return json.dumps(copy).replace(json.dumps(marker), raw)


@st.composite
def json_texts(draw, valid: object) -> bytes:
    """Valid JSON with one value swapped for a hostile one, or bytes mangled."""
    text = json.dumps(valid).encode()
    how = draw(st.sampled_from(["splice", "splice", "byte", "truncate", "raw"]))
    if how == "splice":
        path = draw(st.sampled_from(paths_in(valid)))
        return splice(valid, path, draw(st.sampled_from(HOSTILE))).encode()
    if how == "byte":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.binary(min_size=1, max_size=3)) + text[at:]
    if how == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    return draw(st.binary(max_size=64))


KINDS = ["file"] * 6 + ["fifo", "directory", "device", "sparse", "missing"]


def place(path: Path, kind: str, data: bytes) -> None:
    """Put `data` (or a special file of `kind`) at `path`, replacing what is there."""
    special_file(path, kind, data)


# ---------------------------------------------------------------- targets

Run = Callable[[Path, bytes, str], tuple[list[str], dict[str, str]]]


def model_dir(tmp: Path) -> Path:
    d = tmp / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    blob = json.dumps(HEADER).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(64))
    return d


def at_model_file(name: str, pack: bool = False) -> Run:
    def run(tmp: Path, data: bytes, kind: str):
        d = model_dir(tmp)
        if pack:  # a safetensors header: its length, the JSON, then the data
            data = struct.pack("<Q", len(data)) + data + bytes(64)
        place(d / name, kind, data)
        return ["plan", "--root", str(ZEN4), "--model", str(d), "--json"], {}

    return run


def at_root_file(rel: str, source: Path = ZEN4) -> Run:
    def run(tmp: Path, data: bytes, kind: str):
        root = tmp / "root"
        shutil.copytree(source, root)
        for path in root.glob(rel):
            place(path, kind, data)
        return ["plan", "--root", str(root), "--model-size-gib", "1"], {}

    return run


def at_calibration(tmp: Path, data: bytes, kind: str):
    place(tmp / "cal.json", kind, data)
    return ["plan", "--root", str(ZEN4), "--calibration", str(tmp / "cal.json")], {}


def at_request(tmp: Path, data: bytes, kind: str):
    text = data.decode("utf-8", errors="surrogateescape").replace("\x00", "")  # argv has no NUL
    return ["plan", "--root", str(ZEN4), "--json", "--request", text], {}


def at_secrets(tmp: Path, data: bytes, kind: str):
    text = data.decode("utf-8", errors="replace").replace("\x00", "")  # nor does the env
    return ["plan", "--root", str(ZEN4), "--json"], {"ZENVLLM_SECRETS": text}


def at_override(tmp: Path, data: bytes, kind: str):
    place(tmp / "site.j2", kind, b"{% extends parent_template %}\n" + data)
    return ["render", "--override", str(tmp / "site.j2"), "--output", str(tmp / "ctx")], {}


def at_output_dir(tmp: Path, data: bytes, kind: str):
    (tmp / "out").mkdir()
    place(tmp / "out" / "Dockerfile", kind, data)
    place(tmp / "out" / ".zenvllm-output", "file", data)
    return ["render", "--output", str(tmp / "out")], {}


def at_calibrate_out(tmp: Path, data: bytes, kind: str):
    place(tmp / "cal.json", kind, data)  # --model stops it before any measuring
    return ["calibrate", "--out", str(tmp / "cal.json"), "--model", str(tmp / "none")], {}


def at_metrics_file(tmp: Path, data: bytes, kind: str):
    place(tmp / "m.prom", kind, data)
    return ["bench", "--model", str(tmp / "none"), "--metrics-file", str(tmp / "m.prom")], {}


def at_flavor(tmp: Path, data: bytes, kind: str):
    text = data.decode("utf-8", errors="replace").replace("\x00", "")
    return ["plan", "--flavor", text], {}


MANIFEST = {
    "zenvllm_model_manifest": 1,
    "files": {
        "config.json": {
            "size": 2,
            "sha256": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
        }
    },
}


def at_manifest(tmp: Path, data: bytes, kind: str):
    (tmp / "m").mkdir()
    (tmp / "m" / "config.json").write_bytes(b"{}")
    place(tmp / "manifest.json", kind, data)
    return ["model", "check", str(tmp / "m"), "--manifest", str(tmp / "manifest.json")], {}


def at_model_marker(tmp: Path, data: bytes, kind: str):
    (tmp / "m").mkdir()
    (tmp / "m" / "config.json").write_bytes(b"{}")
    place(tmp / "m" / ".zenvllm-model", kind, data)
    (tmp / "manifest.json").write_text(json.dumps(MANIFEST))
    return ["model", "check", str(tmp / "m"), "--manifest", str(tmp / "manifest.json")], {}


TARGETS: dict[str, tuple[Run, object]] = {
    "config.json": (at_model_file("config.json"), CONFIG),
    "safetensors-header": (at_model_file("model.safetensors", pack=True), HEADER),
    "shard-index": (
        at_model_file("model.safetensors.index.json"),
        {"weight_map": {"w": "model.safetensors"}},
    ),
    "calibration": (at_calibration, CALIBRATION),
    "cpu-online": (at_root_file("sys/devices/system/cpu/online"), None),
    "cpuinfo": (at_root_file("proc/cpuinfo"), None),
    "meminfo": (at_root_file("sys/devices/system/node/node0/meminfo"), None),
    "memory.max": (at_root_file("sys/fs/cgroup/**/memory.max", CGROUP2), None),
    "request": (at_request, SETTINGS),
    "secrets": (at_secrets, {"HF_TOKEN": "x"}),
    "override": (at_override, None),
    "output-dir": (at_output_dir, None),
    "calibrate-out": (at_calibrate_out, CALIBRATION),
    "metrics-file": (at_metrics_file, None),
    "flavor": (at_flavor, None),
    "model-manifest": (at_manifest, MANIFEST),
    "model-marker": (
        at_model_marker,
        {"zenvllm_model": 1, "verified": MANIFEST["files"], "writing": {}},
    ),
}
TEXT_SAMPLES = {  # for targets whose valid input is not JSON: a real one to mangle
    "cpu-online": b"0-1\n",
    "cpuinfo": (ZEN4 / "proc" / "cpuinfo").read_bytes()[:2000],
    "meminfo": b"Node 0 MemTotal: 24000000 kB\nNode 0 MemFree: 20000000 kB\n",
    "memory.max": b"8589934592\n",
    "override": b"{% block tuning %}ENV A=1{% endblock %}\n",
    "output-dir": b"# Rendered by `zenvllm render` from d\n",
    "metrics-file": b"# zenvllm bench\n",
    "flavor": b"vcpus=8,ram_gib=32,numa=1,smt=2",
}


@st.composite
def inputs(draw, target: str) -> tuple[bytes, str]:
    valid = TARGETS[target][1]
    if valid is not None:
        data = draw(json_texts(valid))
    else:
        text = TEXT_SAMPLES[target]
        at = draw(st.integers(0, len(text)))
        noise = draw(
            st.sampled_from([b"\xff", b"\x00", b"99999999999999999999999", b"-", b"0-2000000000"])
            | st.binary(max_size=8)
        )
        data = text[:at] + noise + text[at + draw(st.integers(0, 4)) :]
    return data, draw(st.sampled_from(KINDS))


# ---------------------------------------------------------------- the rule


class Hung(Exception):
    pass


def alarm(signum, frame):
    raise Hung("a run blocked for 10 s")


def check(target: str, data: bytes, kind: str) -> None:
    """Run the target's verb on these bytes in-process: exit 0, or 2 with the message."""
    with tempfile.TemporaryDirectory(prefix="zenvllm-fuzz-") as tmp:
        argv, env = TARGETS[target][0](Path(tmp), data, kind)
        out, err = io.StringIO(), io.StringIO()
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        previous = signal.signal(signal.SIGALRM, alarm)
        signal.alarm(10)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = cli.main(argv)
                except SystemExit as exit_:  # argparse's own refusals
                    rc = exit_.code
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert rc in (0, 2), (rc, err.getvalue()[-500:])
    if rc == 2:
        assert (
            err.getvalue().startswith(f"zenvllm {argv[0]}: error: ") or "usage:" in err.getvalue()
        )
        assert out.getvalue() == "", out.getvalue()[:300]


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz(target):
    @FUZZ
    @given(inputs(target))
    def one(case):
        check(target, *case)

    one()


def corpus() -> list[tuple[str, Path]]:
    return sorted((p.parent.name, p) for p in CORPUS.glob("*/*") if p.is_file())


@pytest.mark.parametrize(("target", "path"), corpus(), ids=lambda v: getattr(v, "name", v))
def test_corpus(target, path):
    """Each crash the fuzzer (or issue 27) found, replayed as a regular file and as bytes."""
    check(target, path.read_bytes(), "file")


@settings(max_examples=int(os.environ.get("ZENVLLM_FUZZ_EXAMPLES", "20")) * 2, deadline=None)
@given(json_texts(PROMISE))
def test_fuzz_the_plan_promise_in_the_env(data):
    """ZENVLLM_PLAN is read by the launcher in the image: a UserError, nothing else."""
    text = data.decode("utf-8", errors="replace")
    with contextlib.suppress(UserError):
        deployed.decode(text)
