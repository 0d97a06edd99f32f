"""The image's HEALTHCHECK: GET /health where the launcher told vLLM to listen. Stdlib only."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from zenvllm.core import gate

# The launcher records "HOST PORT" it gave vLLM: behind a router an instance listens
# on the host's private address only, where 127.0.0.1 would find nothing.
LISTEN_FILE = Path("/tmp/zenvllm.listen")
WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def listen() -> tuple[str, str]:
    """(host, port) to probe: the recorded ones, else loopback and ZENVLLM_PORT (or 8000)."""
    try:
        host, port = (gate.read_text(LISTEN_FILE, 256, "", optional=True) or "").split()
    except (gate.InputError, ValueError):
        host, port = "", os.environ.get("ZENVLLM_PORT", "8000")
    return WILDCARDS.get(host, host), port


def probe(port: int | str, timeout: float = 3, host: str = "127.0.0.1") -> str | None:
    """None when vLLM on host:port answers /health with 200; else why not."""
    where = f"[{host}]" if ":" in host and not host.startswith("[") else host
    url = f"http://{where}:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return None if reply.status == 200 else f"{url}: HTTP {reply.status}"
    except OSError as err:
        return f"{url}: {err}"


def healthy(port: int | str, timeout: float = 3) -> bool:
    return probe(port, timeout) is None


def main() -> int:
    host, port = listen()
    problem = probe(port, timeout=4, host=host)
    if problem:
        print(f"health: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
