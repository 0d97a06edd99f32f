"""A bounded load client: N completions at concurrency C, then it stops by itself.

Used by the reliability and ansible tiers to prove that a fault or a rollout under
load fails no request, with a watch on each instance's /health beside it. Standard
library only; loopback traffic only.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.client import HTTPException

PROMPT = "The quick brown fox"


@dataclass
class LoadResult:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    errors: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    slowest: float = 0.0  # seconds of the longest request, answered or failed
    failed_at: list[float] = field(default_factory=list)  # time.monotonic() of each failure

    def add(self, other: LoadResult) -> None:
        """Fold another run's counts into this one."""
        self.sent += other.sent
        self.ok += other.ok
        self.failed += other.failed
        self.errors.update(other.errors)
        self.seconds += other.seconds
        self.slowest = max(self.slowest, other.slowest)
        self.failed_at += other.failed_at

    def summary(self) -> str:
        errors = ", ".join(f"{k} x{v}" for k, v in self.errors.most_common()) or "none"
        return (
            f"sent {self.sent}, ok {self.ok}, failed {self.failed} in {self.seconds:.1f} s "
            f"(errors: {errors}; slowest {self.slowest:.1f} s)"
        )


def complete(
    url: str,
    model: str,
    max_tokens: int,
    timeout: float,
    headers: dict,
    cafile: str | None,
    stream: bool = False,
    expect: str | None = None,
) -> str | None:
    """One completion; a streamed one must run its whole length and end with [DONE], a
    whole one must be `expect` (the model's greedy text for the prompt) when given."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens}
    body |= {"temperature": 0, "stream": stream, "ignore_eos": stream}
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    context = ssl.create_default_context(cafile=cafile) if url.startswith("https") else None
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        if stream:
            return _whole_stream(response, max_tokens)
        reply = json.load(response)
    text = reply["choices"][0]["text"]
    if reply["usage"]["completion_tokens"] < 1:
        raise ValueError("empty completion")
    if expect is not None and text != expect:
        raise WrongAnswer(text)
    return text


class WrongAnswer(ValueError):
    """A reply that is not the greedy text the model gives for the prompt."""


def greedy_text(url: str, model: str, max_tokens: int, headers: dict, cafile: str | None) -> str:
    """What every reply of a judged load must say: the model's greedy text for its prompt.
    Only for a model served in float32: the random test model's greedy steps win by 0.01
    nats or less, which float32's rounding (1e-6 here) cannot flip and bfloat16's can
    (3 of 200 answers of a bfloat16 fleet load differed; field notes)."""
    text = complete(url, model, max_tokens, 120, headers, cafile)
    assert text, text
    return text


def _whole_stream(response, max_tokens: int) -> None:
    """Read server-sent events to the end: a stream cut short raises (IncompleteRead, or
    ValueError when the connection closed cleanly before [DONE])."""
    chunks, finish = 0, None
    for line in response:
        data = line.decode().strip().removeprefix("data: ")
        if data == "[DONE]":
            if chunks < 1 or finish != "length":
                raise ValueError(f"stream of {chunks} chunks finished with {finish!r}")
            return
        if data:
            choice = json.loads(data)["choices"][0]
            chunks += 1
            finish = choice.get("finish_reason") or finish
    raise ValueError(f"stream cut after {chunks} chunks of up to {max_tokens} tokens")


# The pace of a load that runs through a whole rollout or heal: one client, 5 s between
# a reply and the next request, so each instance behind a gateway of two hears from it
# about every 11 s, and a rollout of minutes still sends it dozens of requests. vLLM
# 0.32's workers busy-poll their message queue for 1 s after each message
# (shm_broadcast's busy_loop_s): at two clients pausing 0.5 s, each instance under load
# held a full core doing nothing (measured on the 2-core Zen 4: 1.00 core for a tiny
# model at 2 clients x 0.5 s or 1 x 0.5 s, 0.72 at 1 x 1.5 s, 0.58 at 1 x 3 s, 0.02
# idle: docs/test-runs/2026-12-07-zen4-ansible-tier-serial-cpu.txt), and the suite's
# other workers, starved, took minutes longer. At 3 s a request cost about 1.8 s of a
# core; at 5 s that is about 0.36 of a core (an estimate from those figures, not
# measured), and the loaded tests run for about 30 minutes of a make test on a Zen 3
# (the ansible tier, where every core is busy: 2026-12-08, vmstat 0.7% idle).
STEADY = {"concurrency": 1, "pause": 5.0}


def run_load(
    url: str,
    model: str,
    requests: int = 200,
    concurrency: int = 8,
    max_tokens: int = 8,
    timeout: float = 120.0,
    headers: dict | None = None,
    on_progress=None,
    cafile: str | None = None,  # the CA of an https gateway
    stop: threading.Event | None = None,  # set: the requests not yet sent are not sent
    pause: float = 0.0,  # seconds each client waits after a request (a lighter load)
    stream: bool = False,  # streamed completions, each max_tokens long (ignore_eos)
    expect: str | None = None,  # each whole reply's text must be this (greedy decoding)
) -> LoadResult:
    """Send `requests` completions, `concurrency` at a time; count what fails and why."""
    result = LoadResult()
    lock = threading.Lock()
    start = time.monotonic()

    def one(_: int) -> None:
        if stop is not None and stop.is_set():
            return
        began = time.monotonic()
        try:
            complete(url, model, max_tokens, timeout, headers or {}, cafile, stream, expect)
            outcome = None
        except urllib.error.HTTPError as err:
            outcome = f"HTTP {err.code}"
        # A reply cut short (IncompleteRead, a bad status line) is a failed request too.
        except (urllib.error.URLError, OSError, ValueError, KeyError, HTTPException) as err:
            outcome = type(err).__name__
        with lock:
            result.sent += 1
            result.slowest = max(result.slowest, time.monotonic() - began)
            if outcome is None:
                result.ok += 1
            else:
                result.failed += 1
                result.errors[outcome] += 1
                result.failed_at.append(time.monotonic())
            if on_progress:
                on_progress(result)
        if pause:
            time.sleep(pause)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(requests)))
    result.seconds = time.monotonic() - start
    return result


class BackgroundLoad:
    """Run `run_load` in a thread while a test breaks things; `.join()` gives the result."""

    def __init__(self, *args, **kwargs) -> None:
        self.progress = LoadResult()
        kwargs["on_progress"] = self._progress
        self._stop = kwargs["stop"] = threading.Event()
        self._result: LoadResult | None = None
        self._thread = threading.Thread(target=self._run, args=args, kwargs=kwargs, daemon=True)

    def _progress(self, partial: LoadResult) -> None:
        self.progress = partial

    def _run(self, *args, **kwargs) -> None:
        self._result = run_load(*args, **kwargs)

    def start(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Send no more requests (those under way finish and count)."""
        self._stop.set()

    def wait_for(self, sent: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.progress.sent < sent and self._thread.is_alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.progress.sent} of {sent} requests in {timeout} s")
            time.sleep(0.2)

    def join(self, timeout: float = 900) -> LoadResult:
        self._thread.join(timeout)
        if self._result is None:
            raise TimeoutError(f"load did not finish in {timeout} s: {self.progress.summary()}")
        return self._result


def down(port: int) -> bool:
    """Down for the gateway: refused, reset or an error status. A slow answer is not down."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            return reply.status != 200
    except (TimeoutError, urllib.error.URLError) as err:
        reason = getattr(err, "reason", err)
        return not isinstance(reason, TimeoutError)
    except OSError:
        return True


class HealthWatch:
    """Polls each loopback port's /health every 0.25 s for the length of a `with`
    block, and tells when each was down."""

    def __init__(self, ports: tuple[int, ...]) -> None:
        self.ports = ports
        self.samples: list[tuple[float, dict[int, bool]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), {p: not down(p) for p in self.ports}))
            self._stop.wait(0.25)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def all_down(self) -> int:
        """Samples in which no port answered."""
        return sum(1 for _, up in self.samples if not any(up.values()))

    def down_spans(self, port: int) -> list[tuple[float, float]]:
        spans, start = [], None
        for t, up in self.samples:
            if not up[port] and start is None:
                start = t
            elif up[port] and start is not None:
                spans.append((start, t))
                start = None
        if start is not None:
            spans.append((start, self.samples[-1][0]))
        return spans
