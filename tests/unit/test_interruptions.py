"""Interruptions and a full disk, on real processes: `zenvllm render` killed mid-write
(SIGTERM, SIGINT) or writing onto a filesystem too small for it leaves nothing
half-written, says so, and exits non-zero."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require

from zenvllm.bench.preflight import check_room
from zenvllm.core.errors import UserError

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
ENV = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
RENDER = [sys.executable, "-m", "zenvllm", "render", "--target", "vllm-openai"]


@pytest.fixture
def big_wheelhouse():
    """A 2 GiB sparse wheel on tmpfs: copying it to disk takes long enough to interrupt."""
    require(Path("/dev/shm").is_dir(), "needs /dev/shm")
    house = Path("/dev/shm") / f"zenvllm-test-wheels-{os.getpid()}"
    house.mkdir()
    with (house / "big-1.0-py3-none-any.whl").open("wb") as wheel:
        wheel.truncate(2 << 30)
    yield house
    for path in house.iterdir():
        path.unlink()
    house.rmdir()


def interrupted_render(tmp_path: Path, wheelhouse: Path, sig: signal.Signals):
    """`zenvllm render` signalled as soon as its staging directory appears: the 2 GiB
    copy still lies ahead (waiting for the copy itself to start lost the race on a fast
    machine, whose kernel copies the sparse wheel in a fraction of a second)."""
    out = tmp_path / "ctx"
    proc = subprocess.Popen(
        [*RENDER, "--wheelhouse", str(wheelhouse), "--output", str(out)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a terminal's Ctrl-C reaches it: a shell's background job (CI's `make test`
        # may be one) ignores SIGINT, and Python keeps a signal it finds ignored so.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not list(tmp_path.glob(".ctx.tmp-*")):
        time.sleep(0.005)
    assert list(tmp_path.glob(".ctx.tmp-*")), "render never staged its output"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_render_interrupted_mid_write_leaves_nothing(tmp_path, big_wheelhouse, sig):
    rc, err = interrupted_render(tmp_path, big_wheelhouse, sig)
    assert rc == 128 + sig
    assert f"zenvllm render: interrupted ({sig.name}); nothing half-written was left" in err
    assert list(tmp_path.iterdir()) == []  # no output, no staging directory


@pytest.fixture
def small_fs(tmp_path):
    require(os.geteuid() == 0, "mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_render_onto_a_full_disk_says_so_and_leaves_nothing(small_fs):
    (small_fs / "keep.txt").write_text("the user's\n")
    done = subprocess.run(
        [*RENDER, "--output", str(small_fs / "ctx")], env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "zenvllm render: error: No space left on device" in done.stderr
    assert "free space there or choose another path" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in small_fs.iterdir()) == ["keep.txt"]


def test_bench_onto_a_small_disk_is_refused_before_it_measures(small_fs, tmp_path):
    """`zenvllm bench --out` under 8 MiB free: exit 2 at once, naming the free space and
    the nearest directory that exists (--out's parents are not made), before the
    bandwidth or a server; nothing is written there. The same request with room passes
    the check (bench/preflight.check_room)."""
    (small_fs / "keep.txt").write_text("the user's\n")
    model = tmp_path / "model"
    model.mkdir()
    argv = [sys.executable, "-m", "zenvllm", "bench", "--model", str(model), "--quick"]
    done = subprocess.run(
        [*argv, "--out", str(small_fs / "deeper" / "out")], env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.startswith("zenvllm bench: error: --out's filesystem has ")
    assert f"KiB free ({small_fs}), under the 8 MiB" in done.stderr
    assert "free space there or choose another path" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in small_fs.iterdir()) == ["keep.txt"]
    check_room(tmp_path / "a" / "b")  # the machine's own disk: room
    with pytest.raises(UserError, match=rf"has \d+ KiB free \({small_fs}\)"):
        check_room(small_fs)
