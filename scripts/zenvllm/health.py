"""The image's HEALTHCHECK: GET /health on the port the launcher gave vLLM. Stdlib only."""

from __future__ import annotations

import os
import sys
import urllib.request

from zenvllm.launcher import PORT_FILE


def port() -> str:
    try:
        recorded = PORT_FILE.read_text().strip()
    except OSError:
        recorded = ""
    return recorded or os.environ.get("ZENVLLM_PORT", "8000")


def main() -> int:
    url = f"http://127.0.0.1:{port()}/health"
    try:
        with urllib.request.urlopen(url, timeout=4) as reply:
            return 0 if reply.status == 200 else 1
    except OSError as err:
        print(f"health: {url}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
