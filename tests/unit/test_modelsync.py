"""Fetching a model from a mirror for real, over HTTP on loopback: a cut transfer
resumes with a Range request, a mirror that ignores ranges or sends other bytes never
puts a wrong file in place, and the CLI says what happened and exits 2."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import REPO

from zenvllm.core import modelfiles
from zenvllm.core.gate import InputError
from zenvllm.core.modelfiles import Entry
from zenvllm.runtime import modelsync

BODY = os.urandom(3 * 1024 * 1024 + 17)
CONFIG = b'{"model_type": "llama"}\n'
FILES = {"config.json": CONFIG, "model.safetensors": BODY}
WANTED = {p: Entry(len(b), hashlib.sha256(b).hexdigest()) for p, b in FILES.items()}


class Mirror(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.files = dict(FILES)
        self.cut_after: int | None = None  # close the connection after this many bytes
        self.ranges = True
        self.seen: list[tuple[str, str]] = []  # (path, Range header)


class Handler(BaseHTTPRequestHandler):
    server: Mirror

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = self.path.lstrip("/")
        self.server.seen.append((path, self.headers.get("Range", "")))
        body = self.server.files.get(path)
        if body is None:
            self.send_error(404)
            return
        start = 0
        if self.server.ranges and (asked := self.headers.get("Range")):
            start = int(asked.removeprefix("bytes=").rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        rest = body[start:]
        if self.server.cut_after is not None:
            rest = rest[: self.server.cut_after]
        self.wfile.write(rest)


@pytest.fixture
def mirror():
    server = Mirror()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def url(mirror: Mirror) -> str:
    return f"http://127.0.0.1:{mirror.server_address[1]}/"


def test_a_cut_transfer_resumes_where_it_stopped(mirror, tmp_path):
    model = tmp_path / "m"
    mirror.cut_after = 1_000_000
    with pytest.raises(modelsync.TransferError, match="at 1,000,000 of 3,145,745 bytes"):
        modelsync.fetch(model, WANTED, url(mirror))
    assert not (model / "model.safetensors").exists()  # never half a shard in place
    assert (model / ".zenvllm-partial/model.safetensors").stat().st_size == 1_000_000
    mirror.cut_after = None
    modelsync.fetch(model, WANTED, url(mirror))
    assert (model / "model.safetensors").read_bytes() == BODY
    assert mirror.seen[-1] == ("model.safetensors", "bytes=1000000-")
    assert not (model / ".zenvllm-partial").exists()
    marker = modelsync.read_marker(model)
    assert marker == modelfiles.Marker(WANTED, {})
    # Verified: the mirror is not asked again.
    asked = len(mirror.seen)
    assert modelsync.fetch(model, WANTED, url(mirror)).verified
    assert len(mirror.seen) == asked


def test_a_mirror_that_ignores_ranges_restarts_the_file(mirror, tmp_path):
    model = tmp_path / "m"
    mirror.cut_after = 500_000
    with pytest.raises(modelsync.TransferError):
        modelsync.fetch(model, WANTED, url(mirror))
    mirror.cut_after, mirror.ranges = None, False
    modelsync.fetch(model, WANTED, url(mirror))
    assert (model / "model.safetensors").read_bytes() == BODY


def test_other_bytes_never_take_the_files_place(mirror, tmp_path):
    model = tmp_path / "m"
    mirror.files["model.safetensors"] = bytes(len(BODY))
    with pytest.raises(modelsync.TransferError, match=r"SHA-256 .* is not the manifest"):
        modelsync.fetch(model, WANTED, url(mirror))
    assert not (model / "model.safetensors").exists()
    assert not (model / ".zenvllm-partial/model.safetensors").exists()
    mirror.files["model.safetensors"] = BODY + b"more"
    with pytest.raises(modelsync.TransferError, match="sent more than the manifest's"):
        modelsync.fetch(model, WANTED, url(mirror))
    mirror.files.pop("model.safetensors")
    with pytest.raises(modelsync.TransferError, match="answered 404"):
        modelsync.fetch(model, WANTED, url(mirror))


def test_the_operators_directory_is_never_written(mirror, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_bytes(b"{}")
    with pytest.raises(InputError, match="zenvllm did not write"):
        modelsync.fetch(theirs, WANTED, url(mirror))
    assert sorted(p.name for p in theirs.iterdir()) == ["config.json"]
    assert mirror.seen == []


def test_a_symlink_out_of_the_directory_is_not_followed(mirror, tmp_path):
    model, elsewhere = tmp_path / "m", tmp_path / "elsewhere"
    elsewhere.mkdir()
    wanted = {"sub/config.json": WANTED["config.json"]}
    model.mkdir()
    modelsync.prepare(model, wanted)  # claimed, empty
    (model / "sub").symlink_to(elsewhere)
    mirror.files["sub/config.json"] = CONFIG
    with pytest.raises(InputError, match="a symlink out of"):
        modelsync.fetch(model, wanted, url(mirror))
    assert list(elsewhere.iterdir()) == []


def test_the_cli_exits_2_with_the_reason_and_no_traceback(mirror, tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(modelfiles.manifest_text(WANTED))
    mirror.cut_after = 1000
    argv = [sys.executable, "-m", "zenvllm.runtime", "model", "fetch", str(tmp_path / "m")]
    env = {**os.environ, "PYTHONPATH": str(REPO / "scripts")}
    proc = subprocess.run(
        [*argv, "--manifest", "-", "--url", url(mirror)],
        input=manifest.read_text(),
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "transfer cut at 1,000 of 3,145,745 bytes; run again" in proc.stderr
    mirror.cut_after = None
    proc = subprocess.run(
        [*argv, "--manifest", str(manifest), "--url", url(mirror)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["changed"] is True
    made = subprocess.run(
        [*argv[:4], "manifest", str(tmp_path / "m")], capture_output=True, text=True, env=env
    )
    assert modelfiles.parse_manifest(made.stdout, "made") == WANTED
