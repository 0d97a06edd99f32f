"""Each class of bad input issue 27 found, through the real CLI (a subprocess with a
timeout, so a hang fails): exit 2, the message names the value, the limit or the fix,
nothing on stdout, no traceback, bounded memory, nothing lost. Every test here failed
before the gate (a traceback, a hang, a wrong answer with exit 0, or lost data)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
from pathlib import Path

import pytest
from support.cli import refused, zenvllm
from support.hostile import LLAMA_CONFIG, special_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
ZEN4 = FIXTURES / "test-machine-zen4-2cpu"
CGROUP2 = FIXTURES / "container-cgroup2-cpuset4-7"
CONFIG = LLAMA_CONFIG


def safetensors(header: dict | bytes, data: int = 64) -> bytes:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + bytes(data)


def tensor(start: int, end: int) -> dict:
    return {"dtype": "BF16", "shape": [(end - start) // 2], "data_offsets": [start, end]}


def model(tmp_path: Path, config: dict | bytes | None = None, weights: bytes | None = None) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    text = config if isinstance(config, bytes) else json.dumps(config or CONFIG).encode()
    (d / "config.json").write_bytes(text)
    (d / "model.safetensors").write_bytes(weights or safetensors({"w": tensor(0, 64)}))
    return d


def host_tree(tmp_path: Path, source: Path = ZEN4) -> Path:
    root = tmp_path / "root"
    shutil.copytree(source, root)
    return root


# ---------------------------------------------------------------- tracebacks


def test_a_stray_byte_in_sysfs_is_named(tmp_path):
    root = host_tree(tmp_path)
    (root / "sys/devices/system/cpu/online").write_bytes(b"0-1\xff\n")
    refused(zenvllm("plan", "--root", str(root)), "online: byte 3 (0xff) is not UTF-8")


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested deeper than 64 levels"),
        (b'{"num_hidden_layers": ' + b"7" * 5000 + b"}", "a number of 5,000 digits"),
        (b'{"hidden_size": 1e400}', "the number 1e400 is beyond a float's range"),
        (b'{"num_hidden_layers": 2, "a": "\xff"}', "byte 31 (0xff) is not UTF-8"),
        (
            json.dumps(
                {
                    **CONFIG,
                    "quantization_config": {
                        "quant_method": "compressed-tensors",
                        "config_groups": {"g": 5},
                    },
                }
            ).encode(),
            "quantization_config.config_groups.g is 5, not a JSON object",
        ),
        (
            json.dumps({**CONFIG, "text_config": [1]}).encode(),
            "text_config is [1], not a JSON object",
        ),
    ],
    ids=["deep", "digits", "1e400", "bad-byte", "quant-groups", "text-config"],
)
def test_a_broken_config_json_is_refused_by_name(tmp_path, config, says):
    refused(zenvllm("plan", "--root", str(ZEN4), "--model", str(model(tmp_path, config))), says)


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested deeper than 64 levels"),
        (b'{"w": {"data_offsets": [0, 1e400]}}', "the number 1e400 is beyond a float's range"),
        (b'{"w": {"data_offsets": 5}}', "data_offsets is 5, not a list"),
        ({"a": tensor(0, 64), "b": tensor(32, 64)}, "two tensors share bytes 32 to 64"),
    ],
    ids=["deep", "1e400", "offsets-type", "overlap"],
)
def test_a_broken_safetensors_header_is_refused_by_name(tmp_path, header, says):
    path = model(tmp_path, weights=safetensors(header))
    refused(zenvllm("plan", "--root", str(ZEN4), "--model", str(path)), "model.safetensors", says)


def calibration(**changes) -> dict:
    return {
        "format": 1,
        "cpu_model": "x",
        "cpus": 2,
        "measured_at": "2026-11-24T00:00:00Z",
        "method": "copy",
        "core_alone_gbs": 10.0,
        "nodes": {"0": {"cores": 2, "gbs": 20.0}},
        **changes,
    }


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b'{"format": 1, "x": "\xfe"}', "is not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64"),
        (json.dumps(calibration(core_alone_gbs=1e-300)).encode(), "below 0.01 GB/s"),
        (json.dumps(calibration(nodes={"0": {"cores": 2, "gbs": 1e-3}})).encode(), "below 0.01"),
        (json.dumps(calibration(nodes={"0": []})).encode(), "nodes.0 is [], not a JSON object"),
        (
            json.dumps(calibration(steps=[{"model": 1}])).encode(),
            "steps[0].model is 1, not a string",
        ),
    ],
    ids=["bad-byte", "deep", "tiny-bandwidth", "tiny-node", "node-type", "step-type"],
)
def test_a_broken_calibration_file_is_refused_by_field(tmp_path, content, says):
    path = tmp_path / "cal.json"
    path.write_bytes(content)
    refused(zenvllm("plan", "--root", str(ZEN4), "--calibration", str(path)), says)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ('{"serve_args": 5}', "serve_args is 5, not a list"),
        ('{"extra_env": {"A": 1}}', "extra_env.A is 1, not a string"),
        ('{"max_model_len": -1}', "max_model_len is -1, not a whole number from 0"),
        ('{"image": ["x"]}', 'image is ["x"], not a string'),
    ],
)
def test_request_fields_are_typed(settings, says):
    done = zenvllm("plan", "--root", str(ZEN4), "--json", "--request", settings)
    refused(done, f"--request: {says}")


@pytest.mark.parametrize("secrets", ['"hf_secret_value"', '{"HF_TOKEN": 12345678}', "[" * 999])
def test_malformed_secrets_are_refused_and_never_shown(secrets):
    done = zenvllm("plan", "--root", str(ZEN4), "--json", env={"ZENVLLM_SECRETS": secrets})
    refused(done, "ZENVLLM_SECRETS")
    assert "hf_secret_value" not in done.stderr and "12345678" not in done.stderr


def test_a_template_override_with_a_bad_byte_is_named(tmp_path):
    override = tmp_path / "site.j2"
    override.write_bytes(b"{% extends parent_template %}\n# caf\xe9\n")
    done = zenvllm("render", "--override", str(override), "--output", str(tmp_path / "ctx"))
    refused(done, "site.j2: byte 35 (0xe9) is not UTF-8")
    assert not (tmp_path / "ctx").exists()


# ---------------------------------------------------------------- hangs


def fifo(path: Path) -> Path:
    return special_file(path, "fifo")


def test_a_fifo_for_a_model_shard_is_refused_without_blocking(tmp_path):
    d = model(tmp_path)
    fifo(d / "model.safetensors")
    refused(zenvllm("plan", "--root", str(ZEN4), "--model", str(d), timeout=20), "is a FIFO")


def test_a_fifo_for_proc_cpuinfo_is_refused_without_blocking(tmp_path):
    root = host_tree(tmp_path)
    fifo(root / "proc/cpuinfo")
    refused(zenvllm("plan", "--root", str(root), timeout=20), "cpuinfo is a FIFO")


def test_a_fifo_for_a_calibration_file_is_refused_without_blocking(tmp_path):
    path = fifo(tmp_path / "cal.json")
    refused(zenvllm("plan", "--root", str(ZEN4), "--calibration", str(path), timeout=20), "FIFO")


def test_a_fifo_dockerfile_in_an_output_dir_is_refused_without_blocking(tmp_path):
    out = tmp_path / "ctx"
    out.mkdir()
    fifo(out / "Dockerfile")
    done = zenvllm("render", "--output", str(out), timeout=20)
    refused(done, "a directory zenvllm did not make")
    assert [p.name for p in out.iterdir()] == ["Dockerfile"]


def test_a_fifo_metrics_file_is_refused_without_blocking(tmp_path):
    path = fifo(tmp_path / "zenvllm_bench.prom")
    done = zenvllm("bench", "--model", "/nonexistent", "--metrics-file", str(path), timeout=20)
    refused(done, "--metrics-file", "is a FIFO")


def test_an_unbounded_flavor_is_refused_before_it_is_built():
    done = zenvllm("plan", "--flavor", "vcpus=99999999,ram_gib=64", timeout=20)
    refused(done, "vcpus is 99999999, not a whole number from 1 to 8,192")


def test_a_cpu_list_of_two_billion_is_refused_before_it_is_expanded(tmp_path):
    root = host_tree(tmp_path)
    (root / "sys/devices/system/cpu/online").write_text("0-2000000000\n")
    refused(zenvllm("plan", "--root", str(root), timeout=20), "from 0 to 8191")


# ---------------------------------------------------------------- memory


def peak_child_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def test_a_huge_safetensors_header_costs_no_memory(tmp_path):
    d = model(tmp_path)
    with (d / "model.safetensors").open("wb") as f:  # claims a 1 GB header, sparse
        f.write(struct.pack("<Q", 1_000_000_000) + b"{")
        f.truncate(1_100_000_000)
    done = zenvllm("plan", "--root", str(ZEN4), "--model", str(d))
    refused(done, "claims 1,000,000,000 bytes", "safetensors allows at most 100,000,000")
    assert peak_child_rss_mib() < 400


def test_a_huge_existing_calibrate_out_is_refused_without_reading_it(tmp_path):
    out = tmp_path / "big.json"
    with out.open("wb") as f:
        f.truncate(2_500_000_000)
    refused(zenvllm("calibrate", "--out", str(out)), "is not a calibration zenvllm wrote")
    assert out.stat().st_size == 2_500_000_000
    assert peak_child_rss_mib() < 400


# ---------------------------------------------------------------- wrong answers


def test_a_cgroup_memory_max_of_zero_is_a_limit_not_unset(tmp_path):
    root = host_tree(tmp_path, CGROUP2)
    for path in root.glob("sys/fs/cgroup/**/memory.max"):
        path.write_text("0\n")
    done = zenvllm("plan", "--root", str(root), "--model-size-gib", "1")
    refused(done, "below the 1 GiB minimum", "cgroup memory limit 0")


def test_bench_refuses_the_ports_plan_refuses():
    for verb in ("plan", "bench"):
        done = zenvllm(verb, "--base-port", "70000", "--model", "/nonexistent")
        refused(done, "--base-port: '70000' is not a whole number from 1 to 65535")


def test_bench_dry_run_calls_no_engine_and_says_what_it_did_not_check(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "engine-called"
    for name in ("docker", "podman"):  # anything named like an engine records its call
        (bin_dir / name).write_text(f'#!/bin/sh\necho "$@" >> {called}\nexit 1\n')
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "out"
    done = zenvllm(
        "bench",
        "--model",
        str(model(tmp_path)),
        "--dry-run",
        "--out",
        str(out),
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stderr
    assert not called.exists(), called.read_text()
    assert not out.exists()
    notes = json.loads(done.stdout)["notes"]
    assert any(n.startswith("--dry-run: images not checked") for n in notes), notes
    assert any("compiled or eager mode unknown" in n for n in notes), notes
    assert json.loads(done.stdout)["workload"]["enforce_eager"] is False


def sparse_shard(path: Path, nbytes: int) -> None:
    """A valid shard of one tensor of `nbytes` zero bytes, written sparse."""
    blob = json.dumps({"w": tensor(0, nbytes)}).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + nbytes)


def test_a_stale_shard_beside_an_index_is_not_counted(tmp_path):
    d = model(tmp_path)
    sparse_shard(d / "model.safetensors", 512 << 20)  # left over from an older download
    sparse_shard(d / "model-00001-of-00001.safetensors", 16 << 20)
    index = {"weight_map": {"w": "model-00001-of-00001.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    done = zenvllm("plan", "--root", str(ZEN4), "--model", str(d), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"]["weight_gib"] == round(16 / 1024, 3)  # not 0.516


# ---------------------------------------------------------------- model delivery


@pytest.mark.parametrize(
    ("kind", "data", "says"),
    [
        ("fifo", b"", "is a FIFO"),
        ("device", b"", "is a character device"),
        ("sparse", b"{", "holds more than 67,108,864 bytes"),
        ("file", b'{"zenvllm_model_manifest": 1, "files": {"\xff": 1}}', "is not UTF-8"),
        ("file", b'{"zenvllm_model_manifest": 1, "files": {"../etc/passwd": {}}}', "'..'"),
        ("file", b"[" * 100 + b"]" * 100, "nested deeper than 64"),
    ],
)
def test_a_bad_manifest_is_refused_and_the_model_directory_untouched(tmp_path, kind, data, says):
    target = model(tmp_path)
    before = sorted((p.name, p.read_bytes()) for p in target.iterdir())
    manifest = special_file(tmp_path / "manifest.json", kind, data)
    for action in ("check", "verify"):
        done = zenvllm("model", action, str(target), "--manifest", str(manifest), timeout=20)
        refused(done, says)
    assert sorted((p.name, p.read_bytes()) for p in target.iterdir()) == before


def test_a_manifest_on_stdin_is_bounded(tmp_path):
    done = zenvllm(
        "model",
        "verify",
        str(tmp_path),
        "--manifest",
        "-",
        stdin=" " * (64 * 1024 * 1024 + 1),
        timeout=60,
    )
    assert done.returncode == 2
    assert "stdin holds more than 67,108,864 bytes" in done.stderr
