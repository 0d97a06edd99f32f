"""What bad-input tests put where zenvllm expects a file, and the small Llama config
they break: shared by test_gate, test_bad_input_classes and test_fuzz_inputs."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

# A small Llama's config.json as the planner reads it.
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}
SPARSE_BYTES = 3 << 30  # a "sparse" file's size: GBs of holes, no disk


def special_file(path: Path, kind: str, data: bytes = b"") -> Path:
    """Put a file of `kind` at `path`, replacing whatever is there: "file" (holding
    `data`), "fifo", "directory", "device" (a link to /dev/zero), "socket", "sparse"
    (`data` then holes up to SPARSE_BYTES) or "missing"."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "file":
        path.write_bytes(data)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "socket":
        socket.socket(socket.AF_UNIX).bind(str(path))
    elif kind == "sparse":
        with path.open("wb") as f:
            f.write(data[:64])
            f.truncate(SPARSE_BYTES)
    return path
