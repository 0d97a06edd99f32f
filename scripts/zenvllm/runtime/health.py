"""The image's HEALTHCHECK: GET /health where the launcher told vLLM to listen; and the
wait of a rollout until instances answer it. Stdlib only."""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
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
    return probe_url(f"http://{where}:{port}/health", timeout)


def probe_url(url: str, timeout: float = 3) -> str | None:
    """None when GET url answers 200; else why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return None if reply.status == 200 else f"{url}: HTTP {reply.status}"
    except OSError as err:
        return f"{url}: {err}"


def wait(
    urls: Sequence[str],
    timeout: float,
    every: float,
    ask: Callable[[str, float], str | None] = probe_url,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """None once each URL has answered 200 (an instance's /health during a rollout);
    else, at the deadline, why the first still waiting does not. One process asks every
    `every` seconds: the instances role once polled with a task per ask (a module run,
    0.3 to 0.8 s of CPU beside the starting vLLM it waited for)."""
    deadline = clock() + timeout
    waiting = list(urls)
    while True:
        problems = {url: ask(url, max(0.5, min(5.0, deadline - clock()))) for url in waiting}
        waiting = [url for url, problem in problems.items() if problem]
        if not waiting:
            return None
        if clock() + every > deadline:
            return f"{problems[waiting[0]]} (not 200 within {timeout:g} s)"
        sleep(every)


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
