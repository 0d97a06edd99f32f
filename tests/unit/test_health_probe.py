"""The image's HEALTHCHECK probes where the launcher told vLLM to listen."""

from __future__ import annotations

import http.server
import threading

import pytest

from zenvllm.runtime import health, launcher


@pytest.fixture
def record(tmp_path, monkeypatch):
    path = tmp_path / "zenvllm.listen"
    monkeypatch.setattr(health, "LISTEN_FILE", path)
    return path


@pytest.mark.parametrize(
    ("argv", "written", "probed"),
    [
        (["--host=10.0.0.5", "--port=18301"], "10.0.0.5 18301", ("10.0.0.5", "18301")),
        (["--port", "9000"], "0.0.0.0 9000", ("127.0.0.1", "9000")),
        (["--host", "::", "--port", "9001"], ":: 9001", ("::1", "9001")),
        ([], "0.0.0.0 8000", ("127.0.0.1", "8000")),
    ],
)
def test_the_launcher_records_and_the_probe_reads_the_listen_address(record, argv, written, probed):
    line = launcher.listen_record(["vllm", "serve", "/model", *argv])
    assert line == written
    record.write_text(line)
    assert health.listen() == probed


def test_without_a_record_the_probe_asks_loopback_on_zenvllm_port(record, monkeypatch):
    monkeypatch.setenv("ZENVLLM_PORT", "8123")
    assert health.listen() == ("127.0.0.1", "8123")


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_main_is_healthy_only_where_vllm_listens(record):
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        record.write_text(f"127.0.0.1 {port}")
        assert health.main() == 0
        record.write_text(f"127.0.0.2 {port}")  # another address of the host: nothing there
        assert health.main() == 1
        assert health.probe(port, host="::1") is not None  # IPv6 URL, bracketed
    finally:
        server.shutdown()
