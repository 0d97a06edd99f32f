"""A Llama-architecture Hugging Face model directory -> GGUF, for the llama.cpp peer.

The bench's llama.cpp server must read the very weights vLLM serves. llama.cpp's
own converter needs torch and transformers and refuses a tokenizer whose
pre-tokenizer hash it does not know (every tokenizer made offline here), so the
bench writes GGUF itself with the `gguf` package (llama.cpp's own writer) from the
safetensors files, config.json and tokenizer.json: bf16 as stored, or Q8_0
quantized by `gguf.quants`. Only what the bench models use is supported:
LlamaForCausalLM (and Qwen2 without attention biases), byte-level BPE tokenizers.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.core.model import safetensors_header

# Part of the cache key: a change to what write_gguf writes makes new files.
CONVERTER_VERSION = 1

OUTTYPES = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPES = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
ARCHITECTURES = ("LlamaForCausalLM",)
# HF name (after "model.layers.N.") -> GGUF name (after "blk.N.")
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf: str) -> str:
    if hf in TOP_NAMES:
        return TOP_NAMES[hf]
    prefix, _, rest = hf.partition("model.layers.")
    index, _, leaf = rest.partition(".")
    if prefix or not index.isdigit() or leaf not in LAYER_NAMES:
        raise UserError(f"tensor {hf!r} has no GGUF name here; the llama.cpp peer needs a Llama")
    return f"blk.{index}.{LAYER_NAMES[leaf]}"


def safetensors_bf16(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, uint16 bf16 bits) for each tensor of one safetensors file."""
    _, data_start, header = safetensors_header(path)  # read_model checked the spans
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start)
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "BF16":
            raise UserError(f"{path.name}: {name} is {meta['dtype']}; the converter takes bf16")
        start, end = meta["data_offsets"]
        yield name, data[start:end].view("<u2").reshape(meta["shape"])


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def unrotate(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's Q/K rows are in rotate-half order; GGUF's llama wants them interleaved
    (llama.cpp's converter does the same permutation)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def tokenizer_fields(model_dir: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    where = model_dir / "tokenizer.json"
    fix = "fix or re-download the model's tokenizer.json"
    tok = gate.obj(gate.read_json(where, gate.DOCUMENT, fix), str(where), fix)
    model = gate.obj(tok.get("model", {}), f"{where}: model", fix)
    if model.get("type") != "BPE" or (tok.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        raise UserError(
            f"{model_dir}/tokenizer.json: the llama.cpp peer converts byte-level BPE "
            "tokenizers only; convert this model with llama.cpp's convert_hf_to_gguf.py"
        )
    vocab = model["vocab"]
    size = cfg["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in tok.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        types[added["id"]] = (
            gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return {"tokens": tokens, "types": types, "merges": merges}


def write_gguf(model_dir: Path, out: Path, outtype: str) -> Path:
    """Write `out` (atomically: a temp file renamed into place) from `model_dir`."""
    cfg = gate.read_json(model_dir / "config.json", gate.DOCUMENT, "")  # read_model checked it
    if not set(cfg.get("architectures", [])) & set(ARCHITECTURES):
        raise UserError(
            f"{model_dir}: architecture {cfg.get('architectures')} is not one the llama.cpp "
            f"peer converts ({', '.join(ARCHITECTURES)}); leave llamacpp out of --configs"
        )
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", 0)
    kv_heads = kv_heads or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name(model_dir.name)
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(FILE_TYPES[outtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok = tokenizer_fields(model_dir, cfg)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # tokenizers' ByteLevel pre-tokenizer is GPT-2's regex
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)
    for path in sorted(model_dir.glob("*.safetensors")):
        for name, bits in safetensors_bf16(path):
            target = gguf_name(name)
            if name.endswith("q_proj.weight"):
                bits = unrotate(bits, heads)
            elif name.endswith("k_proj.weight"):
                bits = unrotate(bits, kv_heads)
            if bits.ndim == 1:  # norms: F32, as llama.cpp's converter keeps them
                w.add_tensor(target, bf16_to_f32(bits))
            elif outtype == "bf16":
                w.add_tensor(target, np.ascontiguousarray(bits), raw_dtype=OUTTYPES["bf16"])
            else:
                q = gguf.quants.quantize(bf16_to_f32(bits), OUTTYPES[outtype])
                w.add_tensor(target, q, raw_dtype=OUTTYPES[outtype])  # shape from bytes
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def cache_key(model_dir: Path) -> str:
    """What the GGUF is made from: the config, the tokenizer and each weight file's name,
    size and modification time (hashing GBs of weights on every bench run would not do)."""
    digest = hashlib.sha256(f"zenvllm-gguf-{CONVERTER_VERSION}".encode())
    digest.update(gate.read_bytes(model_dir / "config.json", gate.DOCUMENT, ""))
    for path in sorted([model_dir / "tokenizer.json", *model_dir.glob("*.safetensors")]):
        st = path.stat()
        digest.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def ours(directory: Path) -> bool:
    """A real directory holding nothing but GGUF files this module writes: anything else
    under the cache (a symlink, someone's files) is never removed."""
    names = {f"{t}.gguf" for t in OUTTYPES}
    return (
        directory.is_dir()
        and not directory.is_symlink()
        and all(p.name in names and p.is_file() for p in directory.iterdir())
    )


def cached_gguf(model_dir: Path, outtype: str, cache: Path) -> Path:
    """The model as GGUF `outtype` under `cache`, converted once and reused. The model's
    own directory is never written."""
    if outtype not in OUTTYPES:
        raise UserError(f"GGUF type {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    out = cache / "gguf" / f"{model_dir.name}-{cache_key(model_dir)}" / f"{outtype}.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(model_dir, out, outtype)
        # Conversions of older weights of the same model are never read again: a 1.5 B
        # model's two files are 5 GB.
        mine = re.compile(rf"{re.escape(model_dir.name)}-[0-9a-f]{{16}}")
        for stale in out.parent.parent.iterdir():
            if stale != out.parent and mine.fullmatch(stale.name) and ours(stale):
                shutil.rmtree(stale)
    return out
