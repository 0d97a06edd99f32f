"""vLLM's tensor parallel as the planner plans it, for real: the vllm-openai image runs a
copy of the tiny model split over two ranks, one per core of this machine, from the
container the plan gives (core/container.py: `--tensor-parallel-size=2`, one OpenMP list
per rank), and answers as the unsplit copy does.

The machine has one NUMA node, so the plan is made for a view of it in which each core
is its own node ("a faked two-node view"), with memory node 0 the only one the cgroup
allows, as the real one is: the ranks bind to their own cores and share node 0's memory.
Both copies serve float32 (asked for), so the split's other summation order changes
logprobs by float32 rounding only: the greedy tokens must be equal and every token's
logprob within 1e-3 of the unsplit copy's.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest
from conftest import require
from support import engine
from support.tiny_model import ensure_tiny_model

from zenvllm.bench.launch import SECCOMP_PROFILE
from zenvllm.core.container import container_of
from zenvllm.core.host import Host, Node
from zenvllm.core.model import read_model
from zenvllm.core.plan import Instance, Policy, make_plan
from zenvllm.core.request import Request
from zenvllm.core.topology import read_host
from zenvllm.runtime.health import healthy

pytestmark = pytest.mark.serve

PROMPTS = ("Hello world, the quick brown fox", "Once upon a time", "1 2 3 4 5")
MAX_TOKENS = 8


def one_node_per_core(host: Host) -> Host:
    """This machine as if each allowed core were a NUMA node of its own (memory split
    evenly); the cgroup still allows only the real memory nodes."""
    cpus = sorted(c.id for c in host.cpus if c.id in host.allowed_cpus)
    share = host.mem_total_bytes // len(cpus)
    return dataclasses.replace(
        host,
        cpus=tuple(dataclasses.replace(host.cpu(c), node=i) for i, c in enumerate(cpus)),
        nodes=tuple(Node(i, (c,), share, share) for i, c in enumerate(cpus)),
    )


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    require(engine.engine_ready(), "no container engine answers (run `make engine`)")
    tag, _ = engine.build("vllm-openai", tmp_path_factory.mktemp("logs") / "build.log")
    return tag


def answers(image: str, instance: Instance, work: Path) -> tuple[list[dict], str]:
    """Run the instance's planned container, ask each prompt greedily; replies and log."""
    model = ensure_tiny_model()
    work.mkdir(parents=True, exist_ok=True)
    request = Request(
        deployment="zenvllm-tp-test",
        supervisor="none",
        image=image,
        model_dir=str(model),
        served_model_name="tiny",
        max_model_len=512,
        serve_args=("--enforce-eager",),
        seccomp_profile=str(SECCOMP_PROFILE),
        config_dir=str(work),
        compile_cache_dir="",
    )
    container = container_of(instance, request)
    Path(container.env_file).write_text(container.env_text)
    engine.docker(*container.run_args)
    try:
        url = f"http://127.0.0.1:{container.port}"
        engine.wait_for(lambda: healthy(container.port), 600, "/health", container.name, every=2)
        replies = [
            engine.http_json(
                f"{url}/v1/completions",
                {"model": "tiny", "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0}
                | {"logprobs": 1, "ignore_eos": True},
            )["choices"][0]["logprobs"]
            for p in PROMPTS
        ]
        return replies, engine.logs(container.name)
    finally:
        engine.docker("rm", "-f", container.name, check=False)


def test_a_copy_split_over_two_ranks_answers_as_the_whole_copy(image, tmp_path):
    host = read_host(Path("/"))
    require(len(os.sched_getaffinity(0)) >= 2, "two ranks need two CPUs")
    tiny = read_model(ensure_tiny_model())
    whole = make_plan(host, tiny, Policy(instances=1, dtype="float32", base_port=18471))
    split = make_plan(
        one_node_per_core(host), tiny, Policy(tensor_parallel=2, dtype="float32", base_port=18472)
    )
    (tp,) = split.instances  # two cores: one copy of two ranks
    assert tp.tensor_parallel_size == 2 and len(tp.omp_threads_bind.split("|")) == 2
    assert tp.mems == (0,)  # the only memory node the cgroup allows

    start = time.monotonic()
    expected, _ = answers(image, whole.instances[0], tmp_path / "whole")
    middle = time.monotonic()
    got, log = answers(image, tp, tmp_path / "split")
    print(
        f"ready and answered: whole {middle - start:.0f} s, split {time.monotonic() - middle:.0f} s"
    )

    assert "--tensor-parallel-size=2" in log  # the launcher's exec line
    assert "Worker_TP0" in log and "Worker_TP1" in log, log[-4000:]
    for prompt, a, b in zip(PROMPTS, expected, got, strict=True):
        assert b["tokens"] == a["tokens"], (prompt, a["tokens"], b["tokens"])
        pairs = zip(a["token_logprobs"], b["token_logprobs"], strict=True)
        worst = max(abs(x - y) for x, y in pairs)
        print(f"{prompt!r}: {len(b['tokens'])} tokens equal, logprobs within {worst:.2e}")
        assert worst < 1e-3, (prompt, worst)
