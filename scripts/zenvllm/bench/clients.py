"""The bench's clients: `vllm bench serve` runs from vLLM's image, one per endpoint at
once, their result files parsed (bench/results.py), and what servers say of themselves
(llama-server's token counter, an endpoint's model name).
"""

from __future__ import annotations

import subprocess
import time
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

    image: str  # vLLM's image: every client is its own `vllm bench serve`
    model_dir: Path  # the tokenizer's
    result_dir: Path  # result files and logs
    run_id: str  # the containers' label
    timeout_s: float  # for all the clients of one measurement


def run_clients(
    clients: Clients,
    endpoints: list[tuple[str, str]],  # (base URL, served model name), one client each
    shares: list[Workload],
    stem: str,
    server_counts: bool = False,
) -> list[results.ClientResult]:
    """One `vllm bench serve` per endpoint, all at once; their result files parsed.
    `server_counts`: output tokens as the server counted them (llama.cpp)."""
    result_dir, run_id = clients.result_dir, clients.run_id
    before = [tokens_predicted(url) for url, _ in endpoints] if server_counts else []
    procs = []
    for i, ((url, served), share) in enumerate(zip(endpoints, shares, strict=True)):
        result_name = f"{stem}-client{i}.json"
        args = launch.client_args(url, served, share, "/results", result_name, server_counts)
        name = f"zenvllm-bench-client-{run_id}-{stem}-{i}"
        argv = launch.client_command(
            name, clients.image, clients.model_dir, result_dir, run_id, args
        )
        log = (result_dir / f"{stem}-client{i}.log").open("w")
        procs.append((DOCKER.stream(*argv, out=log), result_name))
    parsed = []
    for i, (path, data) in enumerate(finished(procs, result_dir, clients.timeout_s)):
        result = results.parse_client_result(data, str(path), path.stat().st_mtime)
        if server_counts:
            made = tokens_predicted(endpoints[i][0]) - before[i]
            result = results.counted_by_server(result, data, str(path), made, shares[i].output_len)
        parsed.append(result)
    return parsed


def finished(
    procs: list[tuple[subprocess.Popen[bytes], str]], result_dir: Path, timeout_s: float
) -> list[tuple[Path, Any]]:
    """Each client's result file (named in `procs`, under `result_dir`) read through the
    gate, in launch order, once its client exits: a client past the run's deadline is
    killed, a failed one or one without its file raises with its log's last lines."""
    deadline = time.monotonic() + timeout_s
    done = []
    for proc, name in procs:
        try:
            code = proc.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            raise RuntimeError(f"{name}: client ran over {timeout_s:.0f} s") from None
        path = result_dir / name
        if code != 0 or not path.is_file():
            log = result_dir / name.replace(".json", ".log")
            tail = "\n".join(gate.tail(log).splitlines()[-20:])
            raise RuntimeError(f"client {name} failed (exit {code}):\n{tail}")
        done.append(
            (path, gate.read_json(path, gate.DOCUMENT, "the client's result is not vllm bench's"))
        )
    return done


def served_model(url: str) -> str:
    """The model name an OpenAI-compatible endpoint serves (its first in /v1/models)."""
    try:
        data = http_client.get_json(f"{url}/v1/models", timeout=10)
        return data["data"][0]["id"]  # type: ignore[index]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise UserError(
            f"{url}/v1/models: no model list ({err}); give the base URL of a running "
            "deploy.yml gateway, e.g. http://127.0.0.1:8000"
        ) from None
