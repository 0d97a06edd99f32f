"""The llama.cpp peer's GGUF files: the very weights vLLM serves, in llama.cpp's layout."""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
from support.tiny_model import ensure_tiny_model

from zenvllm.bench import to_gguf
from zenvllm.core.errors import UserError


@pytest.fixture(scope="module")
def model():
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def source(model):
    return dict(to_gguf.safetensors_bf16(model / "model.safetensors"))


def read(path):
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    return reader, tensors


def field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]].tolist()


def test_bf16_file_holds_every_weight_bit_for_bit(model, source, tmp_path):
    cfg = json.loads((model / "config.json").read_text())
    out = to_gguf.write_gguf(model, tmp_path / "m.gguf", "bf16")
    reader, tensors = read(out)
    assert set(tensors) == {to_gguf.gguf_name(n) for n in source}
    assert field(reader, "llama.block_count") == [cfg["num_hidden_layers"]]
    assert field(reader, "llama.attention.head_count_kv") == [cfg["num_key_value_heads"]]
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == cfg["vocab_size"]
    up = tensors["blk.1.ffn_up.weight"]
    assert up.tensor_type == gguf.GGMLQuantizationType.BF16
    assert np.array_equal(
        np.asarray(up.data).view(np.uint16).ravel(),
        source["model.layers.1.mlp.up_proj.weight"].ravel(),
    )
    # Norms are F32 with the same values.
    norm = np.asarray(tensors["output_norm.weight"].data)
    assert norm.dtype == np.float32
    assert np.array_equal(norm, to_gguf.bf16_to_f32(source["model.norm.weight"]))


def test_q_and_k_rows_are_permuted_as_llama_cpp_expects(model, source, tmp_path):
    cfg = json.loads((model / "config.json").read_text())
    _, tensors = read(to_gguf.write_gguf(model, tmp_path / "m.gguf", "bf16"))
    q = np.asarray(tensors["blk.0.attn_q.weight"].data).view(np.uint16)
    hf = source["model.layers.0.self_attn.q_proj.weight"]
    heads = cfg["num_attention_heads"]
    half = hf.shape[0] // heads // 2
    # GGUF row (head h, pair i, j) is HF row (head h, half j, i): interleaved rotary pairs.
    for h, i, j in ((0, 0, 1), (heads - 1, half - 1, 0)):
        gguf_row = h * 2 * half + 2 * i + j
        hf_row = h * 2 * half + j * half + i
        assert np.array_equal(q.reshape(hf.shape)[gguf_row], hf[hf_row])


def test_q8_0_file_is_the_weights_quantized(model, source, tmp_path):
    out = to_gguf.write_gguf(model, tmp_path / "m.gguf", "q8_0")
    _, tensors = read(out)
    down = tensors["blk.0.ffn_down.weight"]
    assert down.tensor_type == gguf.GGMLQuantizationType.Q8_0
    rows, cols = source["model.layers.0.mlp.down_proj.weight"].shape
    assert down.n_bytes == rows * cols // 32 * 34  # 32 weights in 34 bytes
    back = gguf.quants.dequantize(np.asarray(down.data), gguf.GGMLQuantizationType.Q8_0)
    want = to_gguf.bf16_to_f32(source["model.layers.0.mlp.down_proj.weight"])
    # Each block keeps 8 bits: errors within half a step of the block's scale.
    assert np.abs(back.reshape(want.shape) - want).max() <= np.abs(want).max() / 127


def test_cache_converts_once_per_model_and_type(model, tmp_path):
    first = to_gguf.cached_gguf(model, "q8_0", tmp_path)
    stamp = first.stat().st_mtime_ns
    again = to_gguf.cached_gguf(model, "q8_0", tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp
    assert to_gguf.cached_gguf(model, "bf16", tmp_path).parent == first.parent
    # A changed model is another key: never an old conversion of other weights.
    other = tmp_path / "other"
    shutil.copytree(model, other / model.name)
    longer = tmp_path / "longer" / f"{model.name}-v2"  # another model whose name extends it
    shutil.copytree(model, longer)
    kept = to_gguf.cached_gguf(longer, "q8_0", tmp_path).parent
    # Named like a conversion of this model, but not one: someone's files stay.
    theirs = tmp_path / "gguf" / f"{model.name}-{'0' * 16}"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    cfg = json.loads((other / model.name / "config.json").read_text())
    (other / model.name / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-6}))
    newer = to_gguf.cached_gguf(other / model.name, "q8_0", tmp_path)
    assert newer.parent != first.parent
    # The older conversion of the same model is gone; nothing else in the cache is touched.
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir()) == sorted(
        [newer.parent.name, kept.name, theirs.name]
    )
    assert (theirs / "notes.txt").read_text() == "mine\n"
    assert (other / model.name / "model.safetensors").is_file()


def test_unknown_architecture_is_refused_and_leaves_nothing(model, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(model, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "architectures": ["MambaForCausalLM"]}))
    with pytest.raises(UserError, match=r"MambaForCausalLM.*llamacpp out of --configs"):
        to_gguf.write_gguf(bad, tmp_path / "out.gguf", "bf16")
    with pytest.raises(UserError, match=r"'q4_k': choose one of bf16, q8_0"):
        to_gguf.cached_gguf(model, "q4_k", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]
