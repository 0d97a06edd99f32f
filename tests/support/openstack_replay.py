"""A small OpenStack API replay server: recorded responses, served over real HTTP.

No OpenStack cloud is reachable from these machines, so the real clients (openstacksdk,
keystoneauth, the openstack.cloud inventory plugin) talk to this instead. A cassette is
a JSON file of interactions (method, path, optional query -> status, headers, body);
"{endpoint}" in a response stands for this server's own base URL, as a real catalog
names the cloud's, and "{name}" for values[name] when replay() is given values (an
address the test picks, say). A request no interaction matches is answered 501 and
recorded in `unmatched`, so a test can require that the client asked only for what it
recorded.

    with replay(Path("tests/fixtures/openstack/cloud.json")) as cloud:
        ... clouds.yaml with auth_url f"{cloud.url}/identity/v3" ...
        assert not cloud.unmatched
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


@dataclass
class Cloud:
    url: str
    interactions: list[dict]
    requests: list[str] = field(default_factory=list)  # "METHOD /path?query", in order
    unmatched: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)  # "{name}" -> value, in responses
    bodies: list[dict] = field(default_factory=list)  # request bodies that were JSON

    def match(self, method: str, target: str) -> dict | None:
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        for item in self.interactions:
            want = item["request"]
            if want["method"] != method or want["path"].rstrip("/") != parts.path.rstrip("/"):
                continue
            if "query" in want and {k: [str(v)] for k, v in want["query"].items()} != query:
                continue
            return item["response"]
        return None

    def fill(self, text: str, in_json: bool = False) -> str:
        """text with "{endpoint}" and each "{name}" of values replaced (JSON-escaped
        inside a JSON document)."""
        for name, value in {**self.values, "endpoint": self.url}.items():
            text = text.replace("{" + name + "}", json.dumps(value)[1:-1] if in_json else value)
        return text


class Handler(BaseHTTPRequestHandler):
    """Answers from the cassette of the server's Cloud (set once the port is known)."""

    def _answer(self) -> None:
        cloud: Cloud = self.server.cloud  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if raw:
            with contextlib.suppress(ValueError):
                cloud.bodies.append(json.loads(raw))
        cloud.requests.append(f"{self.command} {self.path}")
        response = cloud.match(self.command, self.path)
        if response is None:
            cloud.unmatched.append(f"{self.command} {self.path}")
            response = {"status": 501, "body": {"error": "not in the cassette"}}
        payload = b""
        if "body" in response:
            payload = cloud.fill(json.dumps(response["body"]), in_json=True).encode()
        self.send_response(response["status"])
        for name, value in response.get("headers", {}).items():
            self.send_header(name, cloud.fill(value))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_HEAD = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:  # quiet: tests read requests
        return


@contextlib.contextmanager
def replay(
    cassette: Path, host: str = "127.0.0.1", values: dict[str, str] | None = None
) -> Iterator[Cloud]:
    interactions = json.loads(cassette.read_text())["interactions"]
    server = ThreadingHTTPServer((host, 0), Handler)
    url = f"http://{host}:{server.server_address[1]}"
    cloud = Cloud(url, interactions, values=dict(values or {}))
    server.cloud = cloud  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield cloud
    finally:
        server.shutdown()
        server.server_close()


def clouds_yaml(cloud: Cloud, where: Path) -> Path:
    """An operator's clouds.yaml (cloud `lab`) whose auth_url is the replayed cloud."""
    path = where / "clouds.yaml"
    path.write_text(
        "clouds:\n  lab:\n    auth:\n"
        f"      auth_url: {cloud.url}/identity/v3\n"
        "      username: ops\n      password: s3cret-ops\n      project_name: llm\n"
        "      user_domain_name: Default\n      project_domain_name: Default\n"
        "    region_name: RegionOne\n    identity_api_version: 3\n"
    )
    return path
