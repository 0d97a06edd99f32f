"""Quantized copies of bf16 Llamas, in the on-disk formats vLLM reads on CPU: of
tiny_model's random ones (by shape), or of a one-file Llama directory such as
trained_model's (its tokenizer files and every other *.json, heldout.json and
trained.json among them, copied beside, so the bench scores the copy as the original).

Each copy quantizes exactly its bf16 model, so the two should generate similar text; a
directory's copy is remade when its source changes (the recorded size and sha256 of the
first MiB of model.safetensors, and of config.json, differ). Only the seven linear
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

The INT4 group size is the largest of 128/64/32 dividing every input dimension (from
the shape, or the source's config.json); the CPU kernel also needs every input and
output dimension to be a multiple of 32. Anything else is refused with a ValueError.

    ensure_quant_model(shape="tiny", fmt="awq") -> Path   $ZENVLLM_CACHE/models/tiny-llama-awq
    ensure_quant_copy(source, fmt="w8a8") -> Path         beside it: <source>-w8a8
    python tests/support/quant_model.py [--shape tiny] [--format awq|gptq|w8a8] [DIR]
    python tests/support/quant_model.py --from SOURCE [--format awq|gptq|w8a8] [DIR]

The bf16 model of a shape is made (or reused) beside DIR, for its tokenizer files.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Iterable
from functools import partial
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
    made_here,
    make_atomically,
    read_config,
    read_safetensors,
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
# A source directory's tokenizer files that are not *.json (every *.json is copied).
TOKENIZER_FILES = ("tokenizer.model", "vocab.txt", "merges.txt")
HASHED = 1 << 20  # the bytes of a source's weights hashed to tell a changed source


def quant_dir(shape: Shape, fmt: str) -> Path:
    return default_dir(shape).parent / f"{shape.name}-{fmt}"


def is_quantized(name: str) -> bool:
    return name.removesuffix(".weight").endswith(LINEARS)


def fitting_group_size(inputs: Iterable[int]) -> int:
    """The largest supported INT4 group dividing every linear layer's input size."""
    inputs = sorted(set(inputs))
    for size in GROUP_SIZES:
        if all(n % size == 0 for n in inputs):
            return size
    raise ValueError(
        f"no group size of {GROUP_SIZES} divides every linear layer's input size {inputs}"
    )


def group_size(shape: Shape) -> int:
    return fitting_group_size({shape.hidden, shape.heads * shape.head_dim, shape.intermediate})


def config_group_size(cfg: dict) -> int:
    """The group size for a Llama config.json's linear layers: their inputs are the
    hidden size, the attention heads' (o_proj) and the intermediate size (down_proj)."""
    keys = ("hidden_size", "num_attention_heads", "intermediate_size")
    hidden, heads, intermediate = dims = [cfg.get(key) for key in keys]
    if all(isinstance(n, int) and n > 0 for n in dims):
        head_dim = cfg.get("head_dim") or hidden // heads
        if isinstance(head_dim, int) and head_dim > 0:
            return fitting_group_size({hidden, heads * head_dim, intermediate})
    raise ValueError(f"config.json's {keys} and head_dim are not positive integers")


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


def quantize_tensors(
    tensors: Iterable[tuple[str, np.ndarray]], fmt: str, g: int
) -> dict[str, np.ndarray]:
    """Each linear layer's weight quantized in `fmt` (INT4 in groups of `g` inputs), every
    other tensor as given; tensors as write_safetensors takes them (BF16: uint16 bits)."""
    out: dict[str, np.ndarray] = {}
    for name, data in tensors:
        if not is_quantized(name):
            out[name] = data
            continue
        # quantize exactly the bf16 model's weight
        w = from_bf16_bits(data) if data.dtype == np.uint16 else data.astype(np.float32)
        if w.ndim != 2 or any(n % 32 for n in w.shape):
            raise ValueError(f"{name} {w.shape}: vLLM's CPU kernels need multiples of 32")
        if fmt != "w8a8" and w.shape[1] % g:
            raise ValueError(f"{name} {w.shape}: its input size is not a multiple of group {g}")
        if fmt == "awq":
            parts = quantize_awq(w, g)
        elif fmt == "gptq":
            parts = quantize_gptq(w, g)
        else:
            parts = quantize_w8a8(w)
        stem = name.removesuffix(".weight")
        out.update({f"{stem}.{part}": values for part, values in parts.items()})
    return out


def quantized_tensors(shape: Shape, vocab: int, fmt: str) -> dict[str, np.ndarray]:
    bf16 = ((name, to_bf16_bits(values)) for name, values in float_weights(shape, vocab))
    return quantize_tensors(bf16, fmt, group_size(shape))


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


def write_config(directory: Path, cfg: dict, fmt: str, g: int, **marks) -> None:
    """The bf16 model's config with the format's quantization_config and the markers."""
    cfg = {**cfg, "quantization_config": quantization_config(fmt, g)}
    cfg.update(zenvllm_quant_recipe=RECIPE, zenvllm_quant_format=fmt, **marks)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))


def write_quant_model(directory: Path, shape: Shape, fmt: str, base: Path) -> None:
    for name in (*COPIED, "generation_config.json"):
        shutil.copyfile(base / name, directory / name)
    cfg = json.loads((base / "config.json").read_text())
    write_config(directory, cfg, fmt, group_size(shape))
    tensors = quantized_tensors(shape, cfg["vocab_size"], fmt)
    write_safetensors(directory / "model.safetensors", tensors)


def source_record(source: Path) -> dict:
    """What tells a changed source: its weights' size and first MiB, and its config."""
    weights = source / "model.safetensors"
    with weights.open("rb") as f:
        head = hashlib.sha256(f.read(HASHED)).hexdigest()
    config = hashlib.sha256((source / "config.json").read_bytes()).hexdigest()
    return {"size": weights.stat().st_size, "sha256_first_mib": head, "config_sha256": config}


def write_quant_copy(directory: Path, source: Path, fmt: str, record: dict) -> None:
    cfg = json.loads((source / "config.json").read_text())
    if not isinstance(cfg, dict) or "quantization_config" in cfg:
        raise ValueError(f"{source}/config.json is not a bf16 model's (already quantized?)")
    try:
        g = config_group_size(cfg)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    tensors = read_safetensors(source / "model.safetensors")
    layers = cfg.get("num_hidden_layers")
    if not (isinstance(layers, int) and layers > 0):
        raise ValueError(f"{source}/config.json's num_hidden_layers is {layers!r}")
    linears = [f"model.layers.{i}.{linear}.weight" for i in range(layers) for linear in LINEARS]
    missing = [name for name in linears if name not in tensors]
    if missing:
        raise ValueError(f"{source}/model.safetensors has no {missing[0]}: not a Llama's")
    for path in sorted(source.iterdir()):
        extra = path.suffix == ".json" and path.name != "config.json"
        if path.is_file() and (extra or path.name in TOKENIZER_FILES):
            shutil.copyfile(path, directory / path.name)
    write_config(directory, cfg, fmt, g, zenvllm_quant_source=record)
    quantized = quantize_tensors(tensors.items(), fmt, g)
    write_safetensors(directory / "model.safetensors", quantized)


def made_quant(directory: Path) -> bool:
    """A model directory these makers wrote: a shape's, or a quantized copy of a source."""
    if made_here(directory):
        return True
    if directory.is_symlink() or not directory.is_dir():
        return False
    return "zenvllm_quant_format" in read_config(directory)


def is_current(directory: Path, fmt: str, **marks) -> bool:
    """Made by this recipe in `fmt`, with each of `marks` (by default: of a tiny shape)."""
    marks = marks or {"zenvllm_tiny_recipe": TINY_RECIPE}
    cfg = read_config(directory)
    return (
        cfg.get("zenvllm_quant_recipe") == RECIPE
        and cfg.get("zenvllm_quant_format") == fmt
        and all(cfg.get(key) == value for key, value in marks.items())
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


def ensure_quant_copy(source: Path, fmt: str, directory: Path | None = None) -> Path:
    """A quantized copy of the bf16 Llama directory `source` (one model.safetensors),
    by default beside it as <source>-<fmt>, made (atomically) only if missing or stale:
    of another recipe or format, or of a source that changed since."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
    source = Path(source).absolute()
    if not (source / "model.safetensors").is_file() or not (source / "config.json").is_file():
        raise ValueError(f"{source} has no config.json and one model.safetensors to quantize")
    directory = Path(directory) if directory else source.parent / f"{source.name}-{fmt}"
    if directory.absolute() == source:
        raise ValueError(f"{source} would be replaced by its own quantized copy")
    record = source_record(source)
    if not is_current(directory, fmt, zenvllm_quant_source=record):
        write = partial(write_quant_copy, source=source, fmt=fmt, record=record)
        make_atomically(directory, write, made_quant)
    return directory


def main(args: list[str]) -> None:
    options = {"--shape": None, "--format": "awq", "--from": None}
    while args[:1] and args[0] in options:
        options[args[0]], args = args[1], args[2:]
    directory = Path(args[0]) if args else None
    if options["--from"] and options["--shape"]:
        raise SystemExit("--from SOURCE and --shape SHAPE: give one of them")
    if options["--from"]:
        print(ensure_quant_copy(Path(options["--from"]), options["--format"], directory))
    else:
        print(ensure_quant_model(directory, options["--shape"] or "tiny", options["--format"]))


if __name__ == "__main__":
    main(sys.argv[1:])
