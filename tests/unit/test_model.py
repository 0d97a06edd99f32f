"""Model sizing from config.json and safetensors headers."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from support.cli import zenvllm
from support.tiny_model import ensure_tiny_model

from zenvllm.core.errors import UserError
from zenvllm.core.model import kv_bytes_per_token, model_of_size, read_model

LLAMA_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def write_safetensors(path, tensors: dict[str, int]) -> None:
    """A real safetensors file: header, then `nbytes` zero bytes per tensor."""
    header, offset = {}, 0
    for name, nbytes in tensors.items():
        header[name] = {
            "dtype": "BF16",
            "shape": [nbytes // 2],
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def test_kv_bytes_per_token_for_llama_3_8b():
    # 32 layers x 8 KV heads x 128 head_dim x 2 (K, V) x 2 bytes = 128 KiB per token
    assert kv_bytes_per_token(LLAMA_8B, 2) == 131072


def test_explicit_head_dim_and_missing_kv_heads():
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "head_dim": 32}
    assert kv_bytes_per_token(config, 2) == 2 * 4 * 32 * 2 * 2


def test_read_model_sums_every_shard_from_headers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": 4096, "b": 1024})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"c": 2048})
    model = read_model(tmp_path)
    assert model.weight_bytes == 4096 + 1024 + 2048
    assert model.kv_bytes_per_token == 131072
    assert model.max_model_len == 131072


def test_float32_config_doubles_kv_bytes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_8B, "torch_dtype": "float32"}))
    write_safetensors(tmp_path / "model.safetensors", {"a": 8})
    assert read_model(tmp_path).kv_bytes_per_token == 2 * 131072


def test_missing_config_and_missing_weights_are_refused(tmp_path):
    with pytest.raises(UserError, match=r"no config\.json"):
        read_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    with pytest.raises(UserError, match=r"no \*\.safetensors files"):
        read_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        read_model(tmp_path)


def test_size_only_model():
    model = model_of_size(16)
    assert model.weight_gib == 16 and model.kv_bytes_per_token is None
    with pytest.raises(UserError, match=r"is not a size in \(0, 1048576\] GiB"):
        model_of_size(0)


@pytest.mark.parametrize(
    ("cut", "says"),
    [
        (4, "too short for a safetensors header"),
        (1000, "its header claims"),
        (-100, "tensors need"),
    ],
)
def test_a_truncated_download_is_named_not_a_traceback(tmp_path, cut, says):
    model = tmp_path / "m"
    shutil.copytree(ensure_tiny_model(), model)
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, cut if cut > 0 else size + cut)
    done = zenvllm("plan", "--model", str(model))
    assert done.returncode == 2 and done.stdout == ""
    assert f"{weights}: " in done.stderr and says in done.stderr
    assert "download or convert it again" in done.stderr


def model_dir(tmp_path: Path, config: dict, weights: dict[str, bytes]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    for name, data in weights.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def tiny_weights() -> bytes:
    return (ensure_tiny_model() / "model.safetensors").read_bytes()


def test_a_shard_index_naming_missing_shards_is_refused(tmp_path):
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    path = model_dir(
        tmp_path, {"num_hidden_layers": 2}, {"model-00001-of-00002.safetensors": tiny_weights()}
    )
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        UserError, match=r"names 2 shard\(s\) but 1 are missing \(model-00002-of-00002"
    ):
        read_model(path)


@pytest.mark.parametrize("value", ["2", -1, 0, 2.5, True, [2]])
def test_a_wrongly_typed_config_field_is_refused_by_name(tmp_path, value):
    path = model_dir(tmp_path, {"num_hidden_layers": value}, {"model.safetensors": tiny_weights()})
    with pytest.raises(UserError, match=r"num_hidden_layers is .* not a whole number from 1"):
        read_model(path)


def test_gguf_only_directory_says_what_gguf_is(tmp_path):
    path = model_dir(tmp_path, {}, {"model-Q8_0.gguf": b"GGUF"})
    with pytest.raises(UserError, match=r"GGUF files are llama\.cpp.s; vLLM serves safetensors"):
        read_model(path)


def test_mla_caches_one_latent_per_layer():
    # DeepSeek-V3's shape: 61 layers, kv_lora_rank 512 + qk_rope_head_dim 64, bf16.
    config = {
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "hidden_size": 7168,
    }
    assert kv_bytes_per_token(config, 2) == 61 * (512 + 64) * 2


def test_missing_attention_fields_plan_size_only():
    assert kv_bytes_per_token({"num_hidden_layers": 2}, 2) is None
