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


class Clock:
    """A fake monotonic clock that sleeping moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.asked: list[tuple[float, str]] = []

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_asks_until_every_url_answers_and_asks_no_answered_one_again():
    clock = Clock()
    ready_at = {"http://a/health": 3.0, "http://b/health": 7.0}

    def ask(url: str, timeout: float) -> str | None:
        clock.asked.append((clock.now, url))
        return None if clock.now >= ready_at[url] else f"{url}: refused"

    assert health.wait(list(ready_at), 60, 1, ask, lambda: clock.now, clock.sleep) is None
    assert clock.now == 7.0  # ready at 7 s, asked every second: no later than needed
    asked_a = [t for t, url in clock.asked if url == "http://a/health"]
    assert asked_a == [0, 1, 2, 3]  # answered at 3 s, then left alone


def test_wait_says_why_at_the_deadline_and_never_sleeps_past_it():
    clock = Clock()

    def ask(url: str, timeout: float) -> str | None:
        assert 0.5 <= timeout <= 5  # each ask bounded, however near the deadline
        return f"{url}: HTTP 503"

    problem = health.wait(["http://a/health"], 30, 4, ask, lambda: clock.now, clock.sleep)
    assert problem == "http://a/health: HTTP 503 (not 200 within 30 s)"
    assert 26 <= clock.now <= 30


def test_health_wait_command_waits_for_a_real_server_and_refuses_bad_seconds(capfd):
    from zenvllm.runtime import commands_health, console

    verbs = (commands_health,)
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert console.run(verbs, ["health", "wait", f"{url}/health"]) == 0
        float(capfd.readouterr().out)  # the seconds waited
        missing = f"{url}/nothing-here"
        assert console.run(verbs, ["health", "wait", "--timeout", "1", missing]) == 1
        assert f"{missing}: HTTP Error 404" in capfd.readouterr().err
    finally:
        server.shutdown()
    assert console.run(verbs, ["health", "wait", "--timeout", "nan", url]) == 2
    assert "--timeout is 'nan', not a number in (0, 86,400]" in capfd.readouterr().err
