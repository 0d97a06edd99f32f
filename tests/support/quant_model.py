"""Quantized copies of tiny_model's random Llamas, in the on-disk formats vLLM reads on CPU.

Each copy quantizes exactly the bf16 model of the same shape (same seed, same weights,
same tokenizer files), so the two should generate similar text. Only the seven linear
layers of each block are quantized; the embedding, lm_head and the norms stay BF16, as
in real checkpoints. vLLM (0.32) picks the method from config.json's
`quantization_config` alone; no `--quantization` flag is needed.

`awq`  (AutoAWQ "gemm", INT4, zero point; vllm/model_executor/layers/quantization/
       auto_awq.py AutoAWQMarlinLinearMethod -> kernels/linear/mixed_precision/cpu.py)
    qweight I32 [in, out/8]  packed along out, nibble i holds column AWQ_ORDER[i]
    qzeros  I32 [in/g, out/8] packed the same way, the zero point itself (0..15)
    scales  F16 [in/g, out]   w = (q - zero) * scale
`gptq` (AutoGPTQ/GPTQModel v1 "gptq", INT4, sym, desc_act false; auto_gptq.py
       AutoGPTQLinearMethod -> the same CPU kernel)
    qweight I32 [in/8, out]   packed along in, nibble i holds row 8p+i
    qzeros  I32 [in/g, out/8] 0x77777777: zero 8 stored minus one (v1); vLLM ignores it
    scales  F16 [in/g, out]   w = (q - 8) * scale
    g_idx   I32 [in]          k // g; vLLM drops it (base_config.py's .g_idx mapper)
`w8a8` (compressed-tensors "int-quantized"; compressed_tensors_w8a8_int8.py ->
       kernels/linear/scaled_mm/cpu.py oneDNN, or zentorch.py on the zen image)
    weight       I8   [out, in]  symmetric, w = q * weight_scale
    weight_scale BF16 [out, 1]   per output channel; activations per token, dynamic
                                 and symmetric (no input_scale tensor)

The INT4 group size is the largest of 128/64/32 dividing every input dimension; the CPU
kernel also needs every input and output dimension to be a multiple of 32.

    ensure_quant_model(shape="tiny", fmt="awq") -> Path   $ZENVLLM_CACHE/models/tiny-llama-awq
    python tests/support/quant_model.py [--shape tiny] [--format awq|gptq|w8a8] [DIR]

The bf16 model of the shape is made (or reused) beside DIR, for its tokenizer files.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a script: import the support package as the tests do
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.tiny_model import RECIPE as TINY_RECIPE
from support.tiny_model import (
    SHAPES,
    Shape,
    default_dir,
    ensure_tiny_model,
    float_weights,
    make_atomically,
    read_config,
    to_bf16_bits,
    write_safetensors,
)

# Bump when a format's recipe changes: a cached model with another version is remade.
RECIPE = 1
FORMATS = ("awq", "gptq", "w8a8")
LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
GROUP_SIZES = (128, 64, 32)
# AutoAWQ's order within an int32: nibble i (bits 4i..4i+3) holds column AWQ_ORDER[i] of
# each 8; vLLM undoes it with [0, 4, 1, 5, 2, 6, 3, 7] (auto_awq.py).
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
SEQUENTIAL = tuple(range(8))
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def quant_dir(shape: Shape, fmt: str) -> Path:
    return default_dir(shape).parent / f"{shape.name}-{fmt}"


def is_quantized(name: str) -> bool:
    return name.removesuffix(".weight").endswith(LINEARS)


def group_size(shape: Shape) -> int:
    """The largest supported INT4 group dividing every linear layer's input size."""
    inputs = {shape.hidden, shape.heads * shape.head_dim, shape.intermediate}
    for size in GROUP_SIZES:
        if all(n % size == 0 for n in inputs):
            return size
    raise ValueError(f"no group size of {GROUP_SIZES} divides {sorted(inputs)}")


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def pack_int4(values: np.ndarray, axis: int, order: tuple[int, ...]) -> np.ndarray:
    """Pack 0..15 values eight to an int32 along `axis`: nibble i holds value order[i]."""
    moved = np.moveaxis(values.astype(np.uint32), axis, -1)
    eights = moved.reshape(*moved.shape[:-1], -1, 8)[..., list(order)]
    packed = (eights << (4 * np.arange(8, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32)
    return np.moveaxis(packed.view(np.int32), -1, axis)


def quantize_awq(w: np.ndarray, g: int) -> dict[str, np.ndarray]:
    """Asymmetric per-group min/max INT4 of an [out, in] weight, AutoAWQ's layout."""
    groups = w.T.reshape(-1, g, w.shape[0])  # [in/g, g, out]
    lo, hi = groups.min(axis=1), groups.max(axis=1)
    scales = np.maximum((hi - lo) / 15, 1e-6).astype(np.float16)
    s = scales.astype(np.float32)
    zeros = np.clip(np.round(-lo / s), 0, 15)
    q = np.clip(np.round(groups / s[:, None]) + zeros[:, None], 0, 15).reshape(w.shape[::-1])
    return {
        "qweight": pack_int4(q, 1, AWQ_ORDER),
        "qzeros": pack_int4(zeros, 1, AWQ_ORDER),
        "scales": scales,
    }


def quantize_gptq(w: np.ndarray, g: int) -> dict[str, np.ndarray]:
    """Symmetric per-group INT4 (zero 8) of an [out, in] weight, GPTQ's v1 layout."""
    groups = w.T.reshape(-1, g, w.shape[0])  # [in/g, g, out]
    scales = np.maximum(np.abs(groups).max(axis=1) * 2 / 15, 1e-6).astype(np.float16)
    s = scales.astype(np.float32)
    q = np.clip(np.round(groups / s[:, None]) + 8, 0, 15).reshape(w.shape[::-1])
    return {
        "qweight": pack_int4(q, 0, SEQUENTIAL),
        "qzeros": np.full((scales.shape[0], w.shape[0] // 8), 0x77777777, dtype=np.int32),
        "scales": scales,
        "g_idx": (np.arange(w.shape[1]) // g).astype(np.int32),
    }


def quantize_w8a8(w: np.ndarray) -> dict[str, np.ndarray]:
    """Symmetric per-output-channel INT8 of an [out, in] weight, compressed-tensors' layout."""
    scale_bits = to_bf16_bits(np.maximum(np.abs(w).max(axis=1, keepdims=True) / 127, 1e-8))
    q = np.clip(np.round(w / from_bf16_bits(scale_bits)), -127, 127).astype(np.int8)
    return {"weight": q, "weight_scale": scale_bits}


def quantized_tensors(shape: Shape, vocab: int, fmt: str) -> dict[str, np.ndarray]:
    g = group_size(shape)
    out: dict[str, np.ndarray] = {}
    for name, values in float_weights(shape, vocab):
        bits = to_bf16_bits(values)
        if not is_quantized(name):
            out[name] = bits
            continue
        w = from_bf16_bits(bits)  # quantize exactly the bf16 model's weight
        if any(n % 32 for n in w.shape):
            raise ValueError(f"{name} {w.shape}: vLLM's CPU kernels need multiples of 32")
        if fmt == "awq":
            parts = quantize_awq(w, g)
        elif fmt == "gptq":
            parts = quantize_gptq(w, g)
        else:
            parts = quantize_w8a8(w)
        stem = name.removesuffix(".weight")
        out.update({f"{stem}.{part}": data for part, data in parts.items()})
    return out


def quantization_config(fmt: str, g: int) -> dict:
    if fmt == "awq":  # AutoAWQConfig.from_config
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": g,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": None,
        }
    if fmt == "gptq":  # AutoGPTQConfig.from_config
        return {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": g,
            "desc_act": False,
            "sym": True,
            "lm_head": False,
            "static_groups": False,
            "true_sequential": True,
            "damp_percent": 0.01,
            "checkpoint_format": "gptq",
        }
    int8 = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None}
    return {  # CompressedTensorsConfig.from_config; llm-compressor's W8A8 preset
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {**int8, "strategy": "channel", "dynamic": False},
                "input_activations": {**int8, "strategy": "token", "dynamic": True},
                "output_activations": None,
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


def write_quant_model(directory: Path, shape: Shape, fmt: str, base: Path) -> None:
    for name in (*COPIED, "generation_config.json"):
        shutil.copyfile(base / name, directory / name)
    cfg = json.loads((base / "config.json").read_text())
    cfg["quantization_config"] = quantization_config(fmt, group_size(shape))
    cfg["zenvllm_quant_recipe"] = RECIPE
    cfg["zenvllm_quant_format"] = fmt
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = quantized_tensors(shape, cfg["vocab_size"], fmt)
    write_safetensors(directory / "model.safetensors", tensors)


def is_current(directory: Path, fmt: str) -> bool:
    cfg = read_config(directory)
    return (
        cfg.get("zenvllm_quant_recipe") == RECIPE
        and cfg.get("zenvllm_tiny_recipe") == TINY_RECIPE
        and cfg.get("zenvllm_quant_format") == fmt
        and (directory / "model.safetensors").exists()
    )


def ensure_quant_model(
    directory: Path | None = None, shape: str = "tiny", fmt: str = "awq"
) -> Path:
    """The quantized model's directory, made (atomically) only if missing or stale."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
    chosen = SHAPES[shape]
    directory = Path(directory) if directory else quant_dir(chosen, fmt)
    if not is_current(directory, fmt):
        base = ensure_tiny_model(directory.parent / chosen.name, shape)
        make_atomically(directory, lambda tmp: write_quant_model(tmp, chosen, fmt, base))
    return directory


def main(args: list[str]) -> None:
    options = {"--shape": "tiny", "--format": "awq"}
    while args[:1] and args[0] in options:
        options[args[0]], args = args[1], args[2:]
    directory = Path(args[0]) if args else None
    print(ensure_quant_model(directory, options["--shape"], options["--format"]))


if __name__ == "__main__":
    main(sys.argv[1:])
