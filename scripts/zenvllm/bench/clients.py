"""The bench's clients: `vllm bench serve` runs from vLLM's image, one per endpoint at
once, for either model kind; their result files read (a generating model's parsed here,
bench/results.py), and what servers say of themselves (llama-server's token counter,
an endpoint's model name).
"""

from __future__ import annotations

import contextlib
import json
import selectors
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zenvllm.bench import http_client, launch, results
from zenvllm.bench.workloads import Workload
from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.runtime.engine import DOCKER


def tokens_predicted(url: str) -> int:
    """llama-server's own count of the tokens it generated (its Prometheus counter)."""
    try:
        text = http_client.call(f"{url}/metrics", timeout=10).decode("utf-8", errors="replace")
    except OSError as err:  # the configuration fails, not the run
        raise RuntimeError(f"{url}/metrics: {err}") from None
    for line in text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total "):
            return int(float(line.split()[1]))
    raise RuntimeError(f"{url}/metrics has no llamacpp:tokens_predicted_total")


@dataclass(frozen=True)
class Clients:
    """What every client of a run shares."""

    image: str  # vLLM's image: every client runs its `vllm bench serve`
    model_dir: Path  # the tokenizer's
    result_dir: Path  # result files and logs
    run_id: str  # the containers' label
    timeout_s: float  # for all the clients of one measurement


# One long-lived client per endpoint of a run, with vLLM's benchmark imported once: a
# pass is a line on its stdin, not a new container, whose start took 8.6 s on a 2-core
# Zen 4 (7.3 s of it the import), 20 times in the test tier's bench. A line is
# [argv, log]: `vllm bench serve`'s words and the file the pass writes its output to;
# the answer is the pass's exit status.
CLIENT_LOOP = """
import json, os, sys, traceback

# The answers get stdout's pipe to themselves: whatever else prints goes to stderr.
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

for line in sys.stdin:
    argv, log = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    kept = os.dup(1), os.dup(2)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    try:
        if argv[:2] != ["bench", "serve"]:
            raise SystemExit(f"not a vllm bench serve command: {argv[:2]}")
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        main(parser.parse_args(argv[2:]))
        code = 0
    except SystemExit as stop:
        if not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(kept[0], 1)
    os.dup2(kept[1], 2)
    for fd in (out, *kept):
        os.close(fd)
    print(code, file=answers, flush=True)
"""


class ClientPool:
    """A run's clients: one per endpoint index, started on first use, each running
    CLIENT_LOOP until the run closes the pool (its containers carry the run's label)."""

    def __init__(self, clients: Clients) -> None:
        self.clients = clients
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def name(self, index: int) -> str:
        return f"zenvllm-bench-client-{self.clients.run_id}-{index}"

    def client(self, index: int) -> subprocess.Popen[bytes]:
        proc = self.procs.get(index)
        if proc is None or proc.poll() is not None:
            c, name = self.clients, self.name(index)
            if proc is not None:  # it ended: its container goes before a new one
                DOCKER.run("rm", "-f", name, timeout=120)
            argv = launch.client_loop_command(
                name, c.image, c.model_dir, c.result_dir, c.run_id, CLIENT_LOOP
            )
            with (c.result_dir / f"client{index}.log").open("ab") as err:
                proc = DOCKER.converse(*argv, err=err)
            self.procs[index] = proc
        return proc

    def ask(self, index: int, argv: list[str], log: str) -> None:
        """Start a pass on client `index`; its output goes to result_dir/log."""
        proc = self.client(index)
        assert proc.stdin is not None
        proc.stdin.write((json.dumps([argv, f"/results/{log}"]) + "\n").encode())
        proc.stdin.flush()

    def answer(self, index: int, deadline: float) -> int | None:
        """The pass's exit status; None if the client ended. Past the deadline the
        client is removed and the pass raises."""
        proc = self.procs[index]
        assert proc.stdout is not None
        with selectors.DefaultSelector() as waiting:
            waiting.register(proc.stdout, selectors.EVENT_READ)
            if not waiting.select(timeout=max(1.0, deadline - time.monotonic())):
                self.drop(index)
                raise RuntimeError(f"{self.name(index)}: a pass ran past its deadline")
        line = proc.stdout.readline(64).strip()  # an exit status, never more
        if not line:
            self.drop(index)
            return None
        return int(line)

    def drop(self, index: int) -> None:
        """Remove client `index`'s container and reap its `docker run`."""
        proc = self.procs.pop(index)
        DOCKER.run("rm", "-f", self.name(index), timeout=120)
        self.reap(proc)

    def close(self) -> None:
        """End every client: each loop ends at the end of its stdin."""
        for index, proc in list(self.procs.items()):
            assert proc.stdin is not None
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout=30)
                self.reap(self.procs.pop(index))
            except subprocess.TimeoutExpired:
                self.drop(index)

    @staticmethod
    def reap(proc: subprocess.Popen[bytes]) -> None:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def run_pass(
    pool: ClientPool, count: int, args_of: Callable[[int, str], list[str]], stem: str
) -> list[tuple[Path, Any]]:
    """One `vllm bench serve` pass on each of `count` clients, all at once: client i runs
    args_of(i, its result file's name), stem-client{i}.json, and logs to
    stem-client{i}.log. Each result file read, in client order, once every pass ended
    (so no client's answer is left for its next pass to read)."""
    names = []
    for i in range(count):
        result_name = f"{stem}-client{i}.json"
        pool.ask(i, args_of(i, result_name), f"{stem}-client{i}.log")
        names.append(result_name)
    deadline = time.monotonic() + pool.clients.timeout_s
    codes = [pool.answer(i, deadline) for i in range(count)]  # every answer read, then judged
    return [client_result(pool.clients.result_dir, n, c) for n, c in zip(names, codes, strict=True)]


def run_clients(
    pool: ClientPool,
    endpoints: list[tuple[str, str]],  # (base URL, served model name), one client each
    shares: list[Workload],
    stem: str,
    server_counts: bool = False,
) -> list[results.ClientResult]:
    """A generating model's pass: one client per endpoint; their result files parsed.
    `server_counts`: output tokens as the server counted them (llama.cpp)."""
    before = [tokens_predicted(url) for url, _ in endpoints] if server_counts else []

    def args_of(i: int, result_name: str) -> list[str]:
        url, served = endpoints[i]
        return launch.client_args(url, served, shares[i], "/results", result_name, server_counts)

    parsed = []
    for i, (path, data) in enumerate(run_pass(pool, len(endpoints), args_of, stem)):
        result = results.parse_client_result(data, str(path), path.stat().st_mtime)
        if server_counts:
            made = tokens_predicted(endpoints[i][0]) - before[i]
            result = results.counted_by_server(result, data, str(path), made, shares[i].output_len)
        parsed.append(result)
    return parsed


def client_result(result_dir: Path, name: str, code: int | None) -> tuple[Path, Any]:
    """A client's result file `name` read through the gate; a client that failed (`code`
    not 0; None: it ended mid-pass) or left no file raises with its log's last lines."""
    path = result_dir / name
    if code != 0 or not path.is_file():
        log = result_dir / name.replace(".json", ".log")
        tail = "\n".join(gate.tail(log).splitlines()[-20:])
        raise RuntimeError(f"client {name} failed (exit {code}):\n{tail}")
    return path, gate.read_json(path, gate.DOCUMENT, "the client's result is not vllm bench's")


def served_model(url: str) -> str:
    """The model name an OpenAI-compatible endpoint serves (its first in /v1/models)."""
    try:
        data = http_client.get_json(f"{url}/v1/models", timeout=10)
        return str(data["data"][0]["id"])  # type: ignore[index]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise UserError(
            f"{url}/v1/models: no model list ({err}); give the base URL of a running "
            "deploy.yml gateway, e.g. http://127.0.0.1:8000"
        ) from None
