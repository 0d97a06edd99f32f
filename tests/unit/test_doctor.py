"""`zenvllm doctor`: pure checks on fixtures, live probes on this host, the CLI."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require
from support.cpu import has_amx

from zenvllm.cli import main
from zenvllm.core.topology import read_host
from zenvllm.runtime.doctor import (
    FAIL,
    NA,
    NOT_CHECKED,
    OK,
    WARN,
    Check,
    check_mempolicy,
    diagnose,
)
from zenvllm.runtime.probes import Probes, find_library, get_mempolicy_errno, probe

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hosts"
SCRIPTS = REPO / "scripts"


def doctor(name: str) -> dict[str, Check]:
    root = FIXTURES / name
    return {c.name: c for c in diagnose(read_host(root), probe(root))}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["doctor", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_avx2_only_vm_says_avx512_absent_and_zen_pace_wont_accelerate() -> None:
    checks = doctor("vm-milan-8vcpu-avx2")
    assert checks["isa"].status == WARN and "AVX-512 absent" in checks["isa"].finding
    assert checks["vllm-openai"].status == OK and "AVX2" in checks["vllm-openai"].consequence
    assert checks["zen"].status == WARN
    assert "avx512f" in checks["zen"].finding and "inactive" in checks["zen"].consequence
    assert checks["pace"].status == WARN and "not accelerate" in checks["pace"].consequence


def test_intel_host_zen_not_applicable_but_pace_accelerates_as_pace_vllm_decides() -> None:
    checks = doctor("xeon-8480-spr-amx")
    assert checks["zen"].status == NA and "GenuineIntel" in checks["zen"].finding
    assert "the zen image serves as vllm-openai would" in checks["zen"].consequence
    # pace-vllm checks only avx512f + avx512_bf16 (vLLM picked PacePlatform on an SPR view).
    assert checks["pace"].status == OK and "published for AMD EPYC" in checks["pace"].consequence
    assert checks["vllm-openai"].status == OK and "amx_bf16" in checks["vllm-openai"].finding


def test_zen4_host_can_run_every_target() -> None:
    checks = doctor("epyc-9654-nps4")
    assert [checks[t].status for t in ("vllm-openai", "zen", "pace")] == [OK, OK, OK]
    assert checks["numa"].finding.startswith("4 node(s)")


def test_memory_line_explains_the_node_sysfs_shortfall() -> None:
    memory = doctor("test-machine-zen4-2cpu")["memory"]
    assert "23.5 GiB total" in memory.finding
    assert "node sysfs states only 4.1 GiB" in memory.finding
    assert "states only" not in doctor("epyc-9654-nps4")["memory"].finding


def test_fixture_root_leaves_live_probes_unchecked() -> None:
    checks = doctor("epyc-9755-1s-nps1")
    for name in ("mempolicy", "tcmalloc", "iomp", "zentorch", "vllm"):
        assert checks[name].status == NOT_CHECKED, name


def test_numa_cgroup_smt_lines() -> None:
    assert doctor("vm-no-numa-sysfs")["numa"].status == WARN
    memnode = doctor("epyc-9124-cxl-memnode")["numa"]
    assert "memory-only: 1" in memnode.finding
    cg = doctor("container-cgroup2-cpuset4-7")["cgroup"]
    assert "cpuset 4-7 (4 of 64 CPUs)" in cg.finding and "16.0 GiB" in cg.finding
    assert "cgroup v1" in doctor("container-cgroup1")["cgroup"].finding
    assert doctor("vm-openstack-9454-24vcpu")["smt"].finding == "on: 24 CPUs on 12 cores"
    assert doctor("epyc-9354-smt-off")["smt"].finding.startswith("off")


@pytest.mark.parametrize(
    ("err", "status", "text"),
    [
        (0, OK, "permitted"),
        (errno.EPERM, FAIL, "SYS_NICE"),
        (errno.ENOSYS, WARN, "not implemented"),
        (None, NOT_CHECKED, "live kernel"),
    ],
)
def test_mempolicy_check(err: int | None, status: str, text: str) -> None:
    c = check_mempolicy(Probes(numa_sysfs=True, mempolicy_errno=err))
    assert c.status == status
    assert text in c.finding + c.consequence


def test_find_library_searches_dirs_in_order(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "libiomp5.so").write_bytes(b"")
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert find_library(("libiomp5.so",), dirs) == str(tmp_path / "b" / "libiomp5.so")
    assert find_library(("libtcmalloc.so.4",), dirs) == ""


# ------------------------------------------------------------------ the real host


def test_real_host_follows_real_cpuinfo(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "--json")
    report = json.loads(out)
    checks = {c["name"]: c for c in report["checks"]}
    first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    flags = next(ln for ln in first.splitlines() if ln.startswith("flags")).split(":")[1].split()
    # Never hardcode the CPU: the verdict must follow what this machine reports.
    assert checks["isa"]["status"] == (OK if "avx512f" in flags else WARN)
    assert ("AVX-512 absent" in checks["isa"]["finding"]) is ("avx512f" not in flags)
    zen_ok = "avx512f" in flags and "avx512_bf16" in flags and "AuthenticAMD" in first
    assert (checks["zen"]["status"] == OK) is zen_ok
    # AMX: the doctor asks the kernel for tile permission, as the images do.
    assert checks["amx"]["status"] == (OK if has_amx() else NA)
    expected_mempolicy = OK if get_mempolicy_errno() == 0 else FAIL
    assert checks["mempolicy"]["status"] in (expected_mempolicy, WARN)
    for name in ("tcmalloc", "iomp", "zentorch", "vllm"):
        assert checks[name]["status"] != NOT_CHECKED
    assert rc == (1 if any(c["status"] == FAIL for c in checks.values()) else 0)
    assert err == ""


def test_text_output_one_line_per_check(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(capsys, "--root", str(FIXTURES / "vm-milan-8vcpu-avx2"))
    lines = out.strip().splitlines()
    assert rc == 0
    assert len(lines) == 1 + 14
    assert any(ln.startswith("warn") and "AVX-512 absent" in ln for ln in lines)
    assert all(" -> " in ln for ln in lines[1:] if not ln.startswith(NOT_CHECKED))


def test_bad_root_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = run_cli(capsys, "--root", str(tmp_path))
    assert rc == 2 and out == ""
    assert str(tmp_path / "sys/devices/system/cpu") in err and "--root" in err


# A child process installs a seccomp filter (classic BPF over the syscall number and
# its first argument), then execs the real `zenvllm doctor --json`: the kernel itself
# refuses the call with EPERM, the way a container's profile would.
SECCOMP_THEN_DOCTOR = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
ins = lambda code, jt, jf, k: struct.pack("HBBI", code, jt, jf, k)
EPERM, ALLOW = 0x00050000 | 1, 0x7FFF0000
prog = b"".join(ins(*i) for i in PROGRAM)
buf = ctypes.create_string_buffer(prog)
class FProg(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = FProg(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0):
    sys.exit(f"seccomp unavailable: errno {ctypes.get_errno()}")
os.execv(sys.executable, [sys.executable, "-m", "zenvllm", "doctor", "--json"])
"""
# get_mempolicy (239) refused, as Docker's default profile does without SYS_NICE.
NO_MEMPOLICY = "[(0x20, 0, 0, 0), (0x15, 0, 1, 239), (0x06, 0, 0, EPERM), (0x06, 0, 0, ALLOW)]"
# arch_prctl (158) refused only for ARCH_REQ_XCOMP_PERM (0x1023): glibc's own
# arch_prctl calls at exec must pass. A sandbox that denies AMX tiles.
NO_AMX = (
    "[(0x20, 0, 0, 0), (0x15, 0, 3, 158), (0x20, 0, 0, 16), (0x15, 0, 1, 0x1023),"
    " (0x06, 0, 0, EPERM), (0x06, 0, 0, ALLOW)]"
)


def doctor_under_seccomp(program: str) -> tuple[int, dict[str, dict], str]:
    require(os.uname().machine == "x86_64", "the syscall numbers and filters are x86_64")
    code = SECCOMP_THEN_DOCTOR.replace("PROGRAM", program)
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]} if done.stdout else {}
    return done.returncode, checks, done.stderr


def test_mempolicy_refused_by_seccomp_is_reported_with_the_fix() -> None:
    rc, checks, err = doctor_under_seccomp(NO_MEMPOLICY)
    assert rc == 1, err
    mp = checks["mempolicy"]
    assert mp["status"] == FAIL
    assert "Operation not permitted" in mp["finding"]
    assert "--cap-add SYS_NICE" in mp["consequence"] and "seccomp" in mp["consequence"]


def test_amx_refused_by_seccomp_is_a_failure_with_the_fix_where_the_cpu_has_amx() -> None:
    rc, checks, err = doctor_under_seccomp(NO_AMX)
    line = checks["amx"]
    if has_amx():
        assert rc == 1, err
        assert line["status"] == FAIL and "Operation not permitted" in line["finding"]
        assert "Illegal instruction" in line["consequence"] and "seccomp" in line["consequence"]
    else:  # nothing to ask for, so nothing to refuse
        assert line["status"] == NA, line


def test_zentorch_found_without_importing_it(tmp_path: Path) -> None:
    pkg = tmp_path / "zentorch"
    pkg.mkdir()
    # Importing this would fail loudly: the probe must not import it.
    (pkg / "__init__.py").write_text("raise ImportError('imported!')\n")
    meta = tmp_path / "zentorch-2.13.0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: zentorch\nVersion: 2.13.0.1\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{SCRIPTS}"}
    code = "from zenvllm.runtime.probes import zentorch_version; print(zentorch_version())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2.13.0.1"


def test_doctor_and_reader_need_only_the_standard_library() -> None:
    # -S drops site-packages: any third-party import would fail here.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import zenvllm.runtime.commands_doctor, zenvllm.runtime.doctor, zenvllm.core.topology"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code, str(SCRIPTS)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
