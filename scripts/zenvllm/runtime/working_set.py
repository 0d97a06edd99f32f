"""vLLM's reading of the container's memory use, without the page cache it can drop.

vLLM 0.32 checks what a CPU worker may still allocate (its KV cache, after the weights)
as min(the node's free and file pages, cgroup limit - cgroup usage). The node's side
counts file pages as available; the cgroup's side does not, though the kernel drops
them the same way when the cgroup reaches its limit. The weight files' pages are in
the usage just after loading (every rank reads every file), so a limit had to leave
the files' size again on top of weights and KV: above the host's own memory for a
large model cut over hosts (issue 63).

The image registers `plugin()` as a vLLM general plugin (an entry point in the
venv, core-independent: image/render.py writes it), which vLLM loads in each of its
processes before the model. It reads the cgroup's usage as its working set, usage less
file pages, the figure `docker stats` and the kubelet report, so the limit is
weights + runtime + shm + KV and no more. Outside a memory cgroup vLLM reads no usage
and nothing changes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from zenvllm.core import gate

# The distribution image/render.py writes into the image's venv: vLLM finds its
# plugins by entry point, and an entry point needs a dist-info to live in.
DIST_INFO = {
    "METADATA": "Metadata-Version: 2.1\nName: zenvllm-vllm-plugins\nVersion: 1\n",
    "entry_points.txt": (
        "[vllm.general_plugins]\nzenvllm_working_set = zenvllm.runtime.working_set:plugin\n"
    ),
}

# memory.stat of the container's own cgroup: v2's unified file, else v1's controller.
STATS = (Path("/sys/fs/cgroup/memory.stat"), Path("/sys/fs/cgroup/memory/memory.stat"))
# v1 names the subtree's sums total_*; v2's and v1's own counters have no prefix.
FILE_KEYS = (("total_active_file", "total_inactive_file"), ("active_file", "inactive_file"))
FIX = "the cgroup's memory.stat is the kernel's; nothing to fix in zenvllm"


def file_pages(stat: str) -> int:
    """Bytes of file pages (active and inactive) a memory.stat text counts; 0 if none."""
    counters: dict[str, int] = {}
    for line in stat.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            counters[key] = int(value)
    for keys in FILE_KEYS:
        if all(key in counters for key in keys):
            return sum(counters[key] for key in keys)
    return 0


def working_set(usage: int | None, stat: str) -> int | None:
    """The cgroup's usage less the file pages the kernel can drop; None stays None."""
    return None if usage is None else max(0, usage - file_pages(stat))


def read_stat() -> str:
    for path in STATS:
        text = gate.read_text(path, gate.SYSFS, FIX, optional=True)
        if text is not None:
            return text
    return ""


def corrected(read_usage: Callable[[], int | None]) -> Callable[[], int | None]:
    def usage() -> int | None:
        return working_set(read_usage(), read_stat())

    return usage


_registered = False


def plugin() -> None:
    """vLLM's plugin hook, called again wherever vLLM loads plugins: corrects once. It
    must never raise (vLLM does not catch a plugin's error): a vLLM without the reader
    is left as it is. vLLM 0.28 (the pace image) reads usage once, cached before the
    weights load, so it has nothing to correct."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        resources = importlib.import_module("vllm.utils.cpu_resource_utils")  # the image's vLLM
    except ImportError:
        return
    name = "get_cgroup_memory_usage"
    if callable(read := getattr(resources, name, None)):
        setattr(resources, name, corrected(read))
