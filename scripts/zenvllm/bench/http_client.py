"""The bench's one HTTP client: a request to a server it measures, the reply bounded.

Standard library (urllib) only; a failure is urllib's OSError, for the caller to
word. GET for what a server says of itself (its model list, its counters), POST
with a JSON body for what the bench asks of it (vLLM's profiler, one completion).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from zenvllm.core import gate


def call(
    url: str,
    method: str = "GET",
    body: dict[str, Any] | None = None,
    timeout: float = 5,
    limit: int = gate.DOCUMENT,
) -> bytes:
    """The reply's body, at most `limit` bytes; a POST sends `body` as JSON (none: empty)."""
    data = None
    if method == "POST":
        data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, method=method)
    if method == "POST":
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return bytes(reply.read(limit))


def get_json(url: str, timeout: float = 5) -> object:
    fix = "is it a vLLM server?"
    return gate.parse_json(gate.decode(call(url, timeout=timeout) or b"null", url, fix), url, fix)


def post(url: str, body: dict[str, Any] | None = None, timeout: float = 300) -> bytes:
    return call(url, "POST", body, timeout, limit=1 << 20)
