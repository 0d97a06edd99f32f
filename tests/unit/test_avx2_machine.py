"""The AVX2 view's runc wrapper and sitecustomize (tests/support/avx2_machine.py), run
for real on an OCI config and a stand-in torch.cpu; the view on a whole machine is
shown by a recorded run (docs/development.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import avx2_machine


def view(tmp: Path) -> Path:
    for d in ("python", "log", "bundle"):
        (tmp / d).mkdir()
    (tmp / "runc").write_text(avx2_machine.wrapper(tmp))
    (tmp / "runc.real").write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/called"\n')
    for f in ("runc", "runc.real"):
        (tmp / f).chmod(0o755)
    return tmp


def run_wrapper(tmp: Path, config: dict, *args: str) -> dict:
    (tmp / "bundle/config.json").write_text(json.dumps(config))
    subprocess.run([str(tmp / "runc"), *args], check=True, timeout=30)
    assert (tmp / "called").read_text().split() == list(args)  # runc got the same call
    return json.loads((tmp / "bundle/config.json").read_text())


def test_a_created_container_gets_the_view(tmp_path):
    tmp = view(tmp_path)
    config = {
        "process": {"args": ["sh", "-c", "a\nb"], "env": ["PYTHONPATH=/app"]},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
    }
    bundle = str(tmp / "bundle")
    got = run_wrapper(tmp, config, "--root", "/r", "create", "--bundle", bundle, "c1")
    env = got["process"]["env"]
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in env and "ATEN_CPU_CAPABILITY=avx2" in env
    assert "PYTHONPATH=/zenvllm-avx2:/app" in env
    mounts = {m["destination"]: m["source"] for m in got["mounts"]}
    assert mounts["/proc/cpuinfo"] == f"{tmp}/cpuinfo"
    assert mounts["/zenvllm-avx2"] == f"{tmp}/python"
    log = (tmp / "log/containers.log").read_text()
    assert log == f"{os.uname().nodename}\tsh -c a b\n"  # a line per container


def test_a_containers_own_cpuinfo_view_and_isa_are_kept(tmp_path):
    tmp = view(tmp_path)
    theirs = {"destination": "/proc/cpuinfo", "type": "bind", "source": "/intel-amx"}
    config = {"process": {"env": ["ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX"]}, "mounts": [theirs]}
    got = run_wrapper(tmp, config, "create", f"--bundle={tmp}/bundle", "c2")
    assert [m for m in got["mounts"] if m["destination"] == "/proc/cpuinfo"] == [theirs]
    env = got["process"]["env"]
    assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX" in env and "ONEDNN_MAX_CPU_ISA=AVX2" not in env
    assert "PYTHONPATH=/zenvllm-avx2" in env


def test_other_runc_calls_pass_through_untouched(tmp_path):
    tmp = view(tmp_path)
    config = {"process": {"env": []}, "mounts": []}
    assert run_wrapper(tmp, config, "state", "c1") == config
    assert not (tmp / "log/containers.log").exists()


def test_torch_cpu_says_no_avx512_once_imported(tmp_path):
    (tmp_path / "python").mkdir()
    (tmp_path / "python/sitecustomize.py").write_text(avx2_machine.SITECUSTOMIZE)
    package = tmp_path / "lib/torch/cpu"
    package.mkdir(parents=True)
    (tmp_path / "lib/torch/__init__.py").write_text("")
    (package / "__init__.py").write_text(
        "def _is_avx512_supported():\n    return True\n\n"
        "def _is_avx2_supported():\n    return True\n"
    )
    code = "import torch.cpu as c; print(c._is_avx512_supported(), c._is_avx2_supported())"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}/python:{tmp_path}/lib"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "True"]
