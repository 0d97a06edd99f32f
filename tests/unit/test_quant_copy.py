"""Quantized copies of a bf16 Llama directory on disk (quant_model.ensure_quant_copy):
each format dequantizes back to the source within its quantization error, everything
else is carried over unchanged, and the copy is remade only when its source changes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import quant_model
from support.quant_model import ensure_quant_copy, from_bf16_bits
from support.tiny_model import read_safetensors, to_bf16_bits, write_safetensors

EXTRA = {  # every *.json beside config.json, the bench's heldout.json and trained.json too
    "tokenizer.json": '{"model": {"type": "BPE"}}',
    "tokenizer_config.json": '{"bos_token": "<s>"}',
    "generation_config.json": '{"bos_token_id": 1, "eos_token_id": 2}',
    "heldout.json": "[[1, 2, 3], [4, 5, 6]]\n",
    "trained.json": '{"recipe": 2}\n',
}


def bf16_llama(
    where: Path,
    hidden: int = 64,
    intermediate: int = 128,
    heads: int = 2,
    kv_heads: int = 2,
    vocab: int = 64,
    seed: int = 0,
) -> Path:
    """A one-layer bf16 Llama directory of random weights, as trained_model leaves one."""
    head_dim = hidden // heads
    where.mkdir(exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "dtype": "bfloat16",
    }
    (where / "config.json").write_text(json.dumps(config))
    for name, text in EXTRA.items():
        (where / name).write_text(text)
    kv = kv_heads * head_dim
    shapes = {
        "lm_head.weight": (vocab, hidden),
        "model.embed_tokens.weight": (vocab, hidden),
        "model.layers.0.input_layernorm.weight": (hidden,),
        "model.layers.0.mlp.down_proj.weight": (hidden, intermediate),
        "model.layers.0.mlp.gate_proj.weight": (intermediate, hidden),
        "model.layers.0.mlp.up_proj.weight": (intermediate, hidden),
        "model.layers.0.post_attention_layernorm.weight": (hidden,),
        "model.layers.0.self_attn.k_proj.weight": (kv, hidden),
        "model.layers.0.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "model.layers.0.self_attn.q_proj.weight": (heads * head_dim, hidden),
        "model.layers.0.self_attn.v_proj.weight": (kv, hidden),
        "model.norm.weight": (hidden,),
    }
    rng = np.random.default_rng(seed)
    tensors = {name: to_bf16_bits(rng.normal(0, 0.05, dims)) for name, dims in shapes.items()}
    write_safetensors(where / "model.safetensors", tensors)
    return where


def unpack(packed: np.ndarray, axis: int, order: tuple[int, ...]) -> np.ndarray:
    """0..15 values from int32s packed along `axis`: nibble i holds value order[i] of 8."""
    words = np.moveaxis(packed.view(np.uint32), axis, -1)
    values = np.empty((*words.shape, 8), dtype=np.int64)
    for i, position in enumerate(order):
        values[..., position] = (words >> (4 * i)) & 0xF
    return np.moveaxis(values.reshape(*words.shape[:-1], -1), -1, axis)


def dequantized(fmt: str, parts: dict[str, np.ndarray], g: int) -> tuple[np.ndarray, np.ndarray]:
    """An [out, in] weight back from its quantized parts, and each entry's error bound
    (half a step of its scale, which is itself rounded to F16/BF16: 1% slack)."""
    if fmt == "w8a8":
        scale = from_bf16_bits(parts["weight_scale"]).astype(np.float64)  # [out, 1]
        w = parts["weight"].astype(np.float64) * scale
        return w, np.broadcast_to(scale / 2, w.shape) * 1.01
    scales = np.repeat(parts["scales"].astype(np.float64), g, axis=0)  # [in, out]
    if fmt == "awq":
        q = unpack(parts["qweight"], 1, quant_model.AWQ_ORDER)  # [in, out]
        zeros = np.repeat(unpack(parts["qzeros"], 1, quant_model.AWQ_ORDER), g, axis=0)
        assert zeros.min() >= 0 and zeros.max() <= 15
    else:
        q = unpack(parts["qweight"], 0, tuple(range(8)))  # [in, out]
        zeros = np.full(q.shape, 8)
        assert (parts["qzeros"].view(np.uint32) == 0x77777777).all()
        assert (parts["g_idx"] == np.arange(q.shape[0]) // g).all()
    return ((q - zeros) * scales).T, (scales / 2).T * 1.01


@pytest.mark.parametrize("fmt", quant_model.FORMATS)
def test_a_copy_dequantizes_to_its_source_and_carries_the_rest(tmp_path, fmt):
    source = bf16_llama(tmp_path / "llama")
    made = ensure_quant_copy(source, fmt)
    assert made == tmp_path / f"llama-{fmt}"
    src = read_safetensors(source / "model.safetensors")
    out = read_safetensors(made / "model.safetensors")
    g = 64  # the largest of 128/64/32 dividing hidden 64, heads*head_dim 64, intermediate 128
    linears = [name for name in src if quant_model.is_quantized(name)]
    assert len(linears) == 7
    for name in linears:
        stem = name.removesuffix(".weight")
        parts = {k.removeprefix(f"{stem}."): v for k, v in out.items() if k.startswith(f"{stem}.")}
        assert "weight" not in parts or parts["weight"].dtype == np.int8, name
        w, bound = dequantized(fmt, parts, g)
        error = np.abs(w - from_bf16_bits(src[name]).astype(np.float64))
        assert (error <= bound).all(), f"{name}: {error.max()} over {bound[error > bound].min()}"
    for name in src.keys() - set(linears):  # embeddings, lm_head, norms: byte for byte
        assert out[name].dtype == src[name].dtype and out[name].shape == src[name].shape
        assert out[name].tobytes() == src[name].tobytes(), name
    cfg = json.loads((made / "config.json").read_text())
    assert cfg["quantization_config"] == quant_model.quantization_config(fmt, g)
    if fmt != "w8a8":
        assert cfg["quantization_config"]["group_size"] == g
    assert (cfg["zenvllm_quant_recipe"], cfg["zenvllm_quant_format"]) == (quant_model.RECIPE, fmt)
    assert cfg["hidden_size"] == 64 and cfg["dtype"] == "bfloat16"
    for name in EXTRA:
        assert (made / name).read_bytes() == (source / name).read_bytes(), name


def test_a_copy_is_remade_only_when_its_source_changes(tmp_path):
    source = bf16_llama(tmp_path / "llama")
    made = ensure_quant_copy(source, "w8a8", tmp_path / "out")
    weights = made / "model.safetensors"
    before = weights.stat()
    assert ensure_quant_copy(source, "w8a8", tmp_path / "out") == made
    after = weights.stat()
    assert (after.st_mtime_ns, after.st_ino) == (before.st_mtime_ns, before.st_ino)

    bf16_llama(tmp_path / "llama", seed=1)  # retrained: same shapes, other weights
    ensure_quant_copy(source, "w8a8", tmp_path / "out")
    again = read_safetensors(weights)
    new = read_safetensors(source / "model.safetensors")["model.embed_tokens.weight"]
    assert again["model.embed_tokens.weight"].tobytes() == new.tobytes()
    assert weights.stat().st_ino != before.st_ino
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_dimension_not_a_multiple_of_32_is_refused_by_tensor(tmp_path):
    source = bf16_llama(tmp_path / "llama", heads=4, kv_heads=1)  # k_proj, v_proj: 16 out
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight"):
        ensure_quant_copy(source, "awq")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]  # nothing left behind


def test_no_fitting_group_size_is_refused(tmp_path):
    source = bf16_llama(tmp_path / "llama", hidden=48, intermediate=96, heads=1, kv_heads=1)
    with pytest.raises(ValueError, match=r"no group size of \(128, 64, 32\)"):
        ensure_quant_copy(source, "gptq")


def test_the_cli_quantizes_a_directory(tmp_path, capsys):
    source = bf16_llama(tmp_path / "llama")
    quant_model.main(["--from", str(source), "--format", "awq", str(tmp_path / "q")])
    assert capsys.readouterr().out == f"{tmp_path / 'q'}\n"
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "awq"
