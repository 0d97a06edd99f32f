"""What the planner needs to know of a model: its weight bytes and KV bytes per token.

Read from a local Hugging Face model directory (config.json and the safetensors
headers, never the tensors) or given as a bare size. Standard library only.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from zenvllm.core.errors import UserError
from zenvllm.core.host import GIB
from zenvllm.core.quantization import Quantization
from zenvllm.core.quantization import read as read_quantization

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1}


@dataclass(frozen=True)
class Model:
    name: str
    weight_bytes: int
    kv_bytes_per_token: int | None = None  # None: only the size is known
    max_model_len: int | None = None  # the config's max_position_embeddings
    quantization: Quantization | None = None  # None: bf16 or other unquantized weights

    @property
    def weight_gib(self) -> float:
        return self.weight_bytes / GIB


MAX_MODEL_GIB = 1 << 20  # 1 PiB: beyond any host's memory


def model_of_size(gib: float, name: str | None = None) -> Model:
    if not 0 < gib <= MAX_MODEL_GIB:
        raise UserError(
            f"--model-size-gib {gib:g} is not a size in (0, {MAX_MODEL_GIB}] GiB; "
            "give the weights in GiB, e.g. 16"
        )
    return Model(name=name or f"{gib:g} GiB model", weight_bytes=int(gib * GIB))


def config_int(config: dict, key: str, where: str = "config.json") -> int | None:
    """A positive integer field, None when absent; anything else is refused by name."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(
            f"{where}: {key} is {json.dumps(value)[:60]}, not a positive integer; "
            "fix the model's config.json (it must match the weights)"
        )
    return value


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int | None:
    """K and V bytes per token: layers x KV heads x head_dim x 2 x bytes per element.

    MLA (DeepSeek's kv_lora_rank) caches one compressed latent per layer instead.
    Sliding-window layers are counted in full: an upper bound. None when the
    config lacks the fields (an unusual architecture): the plan is then size-only.
    """
    text = config.get("text_config", config)  # multimodal configs nest the LM
    if not isinstance(text, dict):
        raise UserError("config.json: text_config is not an object; fix the model's config.json")
    layers = config_int(text, "num_hidden_layers")
    rank = config_int(text, "kv_lora_rank")
    if layers and rank:
        return layers * (rank + (config_int(text, "qk_rope_head_dim") or 0)) * dtype_bytes
    heads = config_int(text, "num_attention_heads")
    kv_heads = config_int(text, "num_key_value_heads") or heads
    hidden = config_int(text, "hidden_size")
    head_dim = config_int(text, "head_dim") or (hidden // heads if hidden and heads else None)
    if not (layers and kv_heads and head_dim):
        return None
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


def shards(path: Path) -> list[Path]:
    """The safetensors files, all of them: a sharded index must find every shard it names."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            named = sorted(set(weight_map.values()))
            if not all(isinstance(n, str) and n and "/" not in n for n in named):
                raise TypeError("shard names must be file names")
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise UserError(f"{index}: not a valid shard index ({err}); re-download it") from None
        missing = [n for n in named if not (path / n).is_file()]
        if missing:
            raise UserError(
                f"{index} names {len(named)} shard(s) but {len(missing)} are missing "
                f"({', '.join(missing[:3])}); finish the download"
            )
    found = sorted(path.glob("*.safetensors"))
    if not found:
        gguf = (
            " (GGUF files are llama.cpp's; vLLM serves safetensors)"
            if any(path.glob("*.gguf"))
            else ""
        )
        raise UserError(
            f"--model {path}: no *.safetensors files{gguf}; zenvllm sizes models from "
            "safetensors headers (convert the weights, or pass --model-size-gib N)"
        )
    return found


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
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"--model {path}: config.json is not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise UserError(f"--model {path}: config.json is not a JSON object; fix or re-download it")
    weight_files = shards(path)
    dtype = dtype or config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    try:
        kv = kv_bytes_per_token(config, DTYPE_BYTES.get(str(dtype), 2))
        max_len = config_int(config, "max_position_embeddings")
        quantization = read_quantization(config, "config.json")
    except UserError as err:
        raise UserError(f"--model {path}: {err}") from None
    return Model(
        name=path.name,
        weight_bytes=sum(safetensors_bytes(f) for f in weight_files),
        kv_bytes_per_token=kv,
        max_model_len=max_len,
        quantization=quantization,
    )
