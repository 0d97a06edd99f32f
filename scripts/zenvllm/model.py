"""What the planner needs to know of a model: its weight bytes and KV bytes per token.

Read from a local Hugging Face model directory (config.json and the safetensors
headers, never the tensors) or given as a bare size. Standard library only.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from zenvllm.errors import UserError
from zenvllm.host import GIB

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1}


@dataclass(frozen=True)
class Model:
    name: str
    weight_bytes: int
    kv_bytes_per_token: int | None = None  # None: only the size is known
    max_model_len: int | None = None  # the config's max_position_embeddings

    @property
    def weight_gib(self) -> float:
        return self.weight_bytes / GIB


def model_of_size(gib: float, name: str | None = None) -> Model:
    if not gib > 0:
        raise UserError(f"--model-size-gib {gib} is not a positive size; give the weights in GiB")
    return Model(name=name or f"{gib:g} GiB model", weight_bytes=int(gib * GIB))


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int:
    """layers x KV heads x head_dim x 2 (K and V) x bytes per element."""
    text = config.get("text_config", config)  # multimodal configs nest the LM
    layers = text["num_hidden_layers"]
    heads = text["num_attention_heads"]
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    return layers * kv_heads * head_dim * 2 * dtype_bytes


def safetensors_bytes(path: Path) -> int:
    """Bytes of tensor data in one .safetensors file, from its header alone.

    A download cut short is the commonest broken model: the header must parse and
    every tensor must lie inside the file, or the user hears which file and why."""
    size = path.stat().st_size
    fix = "download or convert it again"
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise UserError(f"{path}: {size} bytes, too short for a safetensors header; {fix}")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            raise UserError(
                f"{path}: its header claims {header_len:,} bytes but the file has {size:,}; "
                f"the file is truncated or not safetensors; {fix}"
            )
        try:
            header = json.loads(f.read(header_len))
            spans = [
                (int(t["data_offsets"][0]), int(t["data_offsets"][1]))
                for key, t in header.items()
                if key != "__metadata__"
            ]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
            raise UserError(f"{path}: the safetensors header is not valid ({err}); {fix}") from None
    data = size - 8 - header_len
    if any(not 0 <= start <= end <= data for start, end in spans):
        last = max((end for _, end in spans), default=0)
        raise UserError(
            f"{path}: tensors need {last:,} bytes of data but the file holds {data:,}; "
            f"the file is truncated; {fix}"
        )
    return sum(end - start for start, end in spans)


def read_model(path: Path, dtype: str | None = None) -> Model:
    """Size a local model directory. `dtype` overrides the config's for KV bytes."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UserError(
            f"--model {path}: no config.json there; give a local Hugging Face model "
            "directory, or --model-size-gib N when only the size is known"
        )
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"--model {path}: config.json is not valid JSON ({err})") from None
    weight_files = sorted(path.glob("*.safetensors"))
    if not weight_files:
        raise UserError(
            f"--model {path}: no *.safetensors files; zenvllm sizes models from "
            "safetensors headers (convert the weights, or pass --model-size-gib N)"
        )
    dtype = dtype or config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    try:
        kv = kv_bytes_per_token(config, DTYPE_BYTES.get(str(dtype), 2))
    except (KeyError, TypeError, ZeroDivisionError):
        kv = None  # an architecture without the usual fields: size-only plan
    return Model(
        name=path.name,
        weight_bytes=sum(safetensors_bytes(f) for f in weight_files),
        kv_bytes_per_token=kv,
        max_model_len=config.get("max_position_embeddings"),
    )
