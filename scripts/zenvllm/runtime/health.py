"""The image's HEALTHCHECK: GET /health on the port the launcher gave vLLM. Stdlib only."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

PORT_FILE = Path("/tmp/zenvllm.port")  # the launcher records the port it gave vLLM


def port() -> str:
    try:
        recorded = PORT_FILE.read_text().strip()
    except OSError:
        recorded = ""
    return recorded or os.environ.get("ZENVLLM_PORT", "8000")


def probe(port: int | str, timeout: float = 3) -> str | None:
    """None when vLLM on 127.0.0.1:port answers /health with 200; else why not."""
    url = f"http://127.0.0.1:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return None if reply.status == 200 else f"{url}: HTTP {reply.status}"
    except OSError as err:
        return f"{url}: {err}"


def healthy(port: int | str, timeout: float = 3) -> bool:
    return probe(port, timeout) is None


def main() -> int:
    problem = probe(port(), timeout=4)
    if problem:
        print(f"health: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
