"""vLLM's compile cache, kept on the host so that a restart does not compile again.

In its default compiled mode vLLM traces the model with Dynamo and has Inductor
write and build C++ kernels before it serves: about a minute for a 0.5 B model on
2 cores, paid again at every start unless the artifacts outlive the container.
A deployment mounts one host directory per instance and key at CONTAINER_DIR;
the key changes with anything that shapes the compiled code (image, serve arguments,
env), so a changed instance starts from an empty directory instead of a stale one, and
vLLM and Inductor key their own entries inside it (model config, code, graph, ISA).
Where an instance runs is not part of it: vLLM 0.32 compiles with Inductor's
cpp.dynamic_threads, and a directory one core compiled loads warm on another core and
on two (measured: docs/test-runs/2026-11-27-zen4-compile-cache-across-placements.txt).
So the instances of one shape share a key, each in its own directory (no two
containers write one), and a rolling update starts each from the first one's
(the instances role's tasks/compile_cache_seed.yml): the shape compiles once. Pure.
"""

from __future__ import annotations

import hashlib
import json

from zenvllm.core.deployed import ENV_KEY as PLAN_ENV

# Where the container keeps it (the image creates it, owned by vLLM's user, so a
# named volume mounted there is writable too).
CONTAINER_DIR = "/var/cache/vllm"
# What marks the host's cache directory as zenvllm's (ownership by content, not name):
# this file in it, starting with MARK. The instances role repeats both (a test keeps them equal).
MARK_FILE = ".zenvllm-compile-cache"
MARK = "zenvllm:"


def env(root: str = CONTAINER_DIR) -> dict[str, str]:
    """The variables that put vLLM's and Inductor's caches under `root`.

    VLLM_USE_AOT_COMPILE=0: vLLM 0.32 saves its AOT artifact on the CPU platform but
    cannot load it back ("'function' object has no attribute 'finalize_loading'",
    measured: the warm start compiled again); upstream disables AOT on CPU
    (vllm-project/vllm#32037). Without it vLLM traces with Dynamo (seconds) and
    Inductor's FX graph and AOTAutograd caches skip the code generation and g++.
    """
    return {
        "VLLM_CACHE_ROOT": root,
        "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
        "VLLM_USE_AOT_COMPILE": "0",
    }


# What differs between instances of one shape and not in their compiled code: the port
# they listen on, their cores (the OpenMP binding) and the plan's promise (their name,
# cores, memory node and limits).
PER_INSTANCE_ARGS = ("--port=",)
PER_INSTANCE_ENV = ("VLLM_CPU_OMP_THREADS_BIND", PLAN_ENV)


def key(image: str, command: list[str], env: dict[str, str]) -> str:
    """16 hex digits naming what the compiled code depends on (secrets excluded): the
    same for every instance of one shape, wherever it runs."""
    args = [a for a in command if not a.startswith(PER_INSTANCE_ARGS)]
    shared = sorted((k, v) for k, v in env.items() if k not in PER_INSTANCE_ENV)
    return hashlib.sha256(json.dumps([image, args, shared]).encode()).hexdigest()[:16]


def host_dir(root: str, instance: str, cache_key: str) -> str:
    """The instance's directory for this key: ROOT/INSTANCE/KEY."""
    return f"{root.rstrip('/')}/{instance}/{cache_key}"


def describe(root: str, artifacts: int, size_bytes: int, kept: bool) -> str:
    """The launcher's line: whether this start is warm, cold, or compiles every time."""
    if not kept:
        return (
            f"compile cache: not kept ({root} is not a volume): this start compiles and a "
            f"restart compiles again; mount a host directory or a named volume at "
            f"{CONTAINER_DIR} (a deployment does, one per instance)"
        )
    if artifacts == 0:
        return (
            f"compile cache: cold ({root} is empty): this start compiles and keeps the "
            "result for the next"
        )
    return (
        f"compile cache: warm ({artifacts} compiled artifacts, {size_bytes / 1e6:.1f} MB in "
        f"{root}): this start loads them instead of compiling"
    )
