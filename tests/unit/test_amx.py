"""AMX tile permission: the kernel's real answer on this machine, the .pth hook, every message.

The expectation comes from this machine's own /proc/cpuinfo and kernel: on an AMX
host the permission must be off at start and granted after the request; elsewhere
nothing is asked. The other branches run on constructed states.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cpu import has_amx

from zenvllm.core.topology import read_host
from zenvllm.runtime import amx
from zenvllm.runtime.amx import AmxState
from zenvllm.runtime.doctor import FAIL, NA, NOT_CHECKED, OK, WARN, check_amx

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def python(code: str, *flags: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    done = subprocess.run(
        [sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


def test_a_fresh_process_has_no_permission_and_the_request_grants_it_where_amx_is():
    # A fresh interpreter: this test process may have asked already.
    code = "from zenvllm.runtime import amx; print(amx.state()); print(amx.request())"
    before, after = python(code).splitlines()
    expected = has_amx()
    assert before == repr(AmxState(expected, False))
    assert after == repr(AmxState(expected, expected))


def test_the_pth_line_asks_when_site_processes_it(tmp_path):
    # The image's two .pth files, processed by site as at interpreter start.
    (tmp_path / "zenvllm.pth").write_text(f"{SCRIPTS}\n")
    (tmp_path / "zenvllm_amx.pth").write_text(amx.PTH_LINE)
    code = (
        "import site, sys; site.addsitedir(sys.argv[1]); "
        "import zenvllm.runtime.amx as a; print(a.AT_START)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    expected = has_amx()
    assert done.stdout.strip() == repr(AmxState(expected, expected))


def test_a_broken_hook_never_stops_the_interpreter(monkeypatch):
    def boom():
        raise OSError("no libc")

    monkeypatch.setattr(amx, "request", boom)
    monkeypatch.setattr(amx, "AT_START", None)
    amx.request_at_start()
    assert AmxState(False, False, "OSError: no libc") == amx.AT_START


@pytest.mark.parametrize(
    ("state", "cpuinfo", "at_start", "text"),
    [
        (
            AmxState(True, True),
            True,
            True,
            "requested at interpreter start (zenvllm.pth) and granted",
        ),
        (AmxState(True, True), True, False, "requested by this process and granted"),
        (AmxState(True, False, "EPERM"), True, True, "refused (EPERM)"),
        (AmxState(False, False), True, True, "lists amx_tile but the kernel offers no tile state"),
        (AmxState(False, False), False, True, "not on this CPU; nothing to request"),
    ],
)
def test_the_launchers_line_says_what_holds(state, cpuinfo, at_start, text):
    assert text in amx.describe(state, cpuinfo, at_start)


@pytest.mark.parametrize(
    ("fixture", "state", "status", "text"),
    [
        ("xeon-8480-spr-amx", None, NOT_CHECKED, "amx_tile amx_bf16"),
        ("xeon-8480-spr-amx", AmxState(True, True), OK, "grants tile permission"),
        ("xeon-8480-spr-amx", AmxState(True, False, "Operation not permitted"), FAIL, "seccomp"),
        ("xeon-8480-spr-amx", AmxState(False, False, "Invalid argument"), WARN, "Linux 5.16"),
        ("test-machine-zen4-2cpu", None, NA, "no AMX"),
        ("test-machine-zen4-2cpu", AmxState(False, False), NA, "no AMX"),
    ],
)
def test_doctor_amx_line(fixtures_dir, fixture, state, status, text):
    check = check_amx(read_host(fixtures_dir / fixture), state)
    assert check.status == status
    assert text in check.finding + check.consequence
