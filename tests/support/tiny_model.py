"""Small random-weight Llamas that real vLLM serves, made offline in seconds.

No hub and no torch: weights are numpy bfloat16 bits written with a
hand-made safetensors header, and the byte-level BPE tokenizer is trained
locally with `tokenizers` on generated text. head_dim is at least 32 because
vLLM's CPU attention rejects 16 at the first request (the server passes
/health and then dies), so a smoke test must send a real completion.

Shapes: `tiny` (0.2 M parameters) for the tests, where only start-up and
correctness matter; `bench` (26 M) for the benchmark, big enough that the
forward pass, not vLLM's Python per-step work, is what the CPU spends most
time on; and two real shapes, `qwen0.5b` (494 M) and `qwen1.5b` (1.54 B):
Qwen2.5-0.5B's and -1.5B's dimensions, grouped-query attention (2 KV heads),
tied embeddings and a 151,936-token vocabulary (the tokenizer is trained to
exactly that size on generated words, so every id the model can sample decodes).

    ensure_tiny_model(shape="tiny") -> Path    cached under $ZENVLLM_CACHE/models/
    python tests/support/tiny_model.py [--shape bench|qwen0.5b|qwen1.5b] [DIR]
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Bump when the recipe changes: a cached model with another version is remade.
RECIPE = 1
VOCAB = 512
MAX_LEN = 512
SPECIAL = ["<unk>", "<s>", "</s>"]
SEED = 1234


@dataclass(frozen=True)
class Shape:
    name: str  # the directory: tiny-llama, bench-llama
    hidden: int
    layers: int
    heads: int
    intermediate: int
    kv_heads: int = 0  # grouped-query attention; 0: as many as heads
    vocab: int = VOCAB
    tied: bool = False  # lm_head shares the embedding

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * self.head_dim


SHAPES = {
    "tiny": Shape("tiny-llama", hidden=128, layers=2, heads=4, intermediate=256),
    "bench": Shape("bench-llama", hidden=512, layers=8, heads=8, intermediate=1408),
    "qwen0.5b": Shape(
        "bench-0.5b",
        hidden=896,
        layers=24,
        heads=14,
        intermediate=4864,
        kv_heads=2,
        vocab=151936,
        tied=True,
    ),
    "qwen1.5b": Shape(
        "bench-1.5b",
        hidden=1536,
        layers=28,
        heads=12,
        intermediate=8960,
        kv_heads=2,
        vocab=151936,
        tied=True,
    ),
}


def default_dir(shape: Shape = SHAPES["tiny"]) -> Path:
    cache = Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm"))
    return cache / "models" / shape.name


def corpus(lines: int = 2000, seed: int = SEED) -> list[str]:
    """Deterministic English-ish text, so every machine trains the same tokenizer."""
    rng = random.Random(seed)
    words = [
        "the",
        "a",
        "an",
        "of",
        "to",
        "in",
        "on",
        "for",
        "with",
        "cpu",
        "core",
        "cache",
        "node",
        "memory",
        "thread",
        "model",
        "token",
        "server",
        "request",
        "epyc",
        "zen",
        "vector",
        "matrix",
        "kernel",
        "layer",
        "weight",
        "batch",
        "prompt",
        "answer",
        "fast",
        "small",
        "large",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "and",
        "or",
        "but",
        "is",
        "are",
        "was",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "hello",
        "world",
        "vllm",
        "serve",
    ]
    out = []
    for _ in range(lines):
        n = rng.randint(4, 16)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        out.append(sentence.capitalize() + rng.choice([".", "!", "?", ","]))
    return out


def many_words(lines: int = 60000, seed: int = SEED) -> list[str]:
    """Text of 120,000 generated words: enough merges for a real-sized vocabulary."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(120000)]
    return [" ".join(rng.choice(words) for _ in range(12)) for _ in range(lines)]


def train_tokenizer(vocab: int = VOCAB):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = corpus() + (many_words() if vocab > VOCAB else [])
    tok.train_from_iterator(text, trainer=trainer)
    if tok.get_vocab_size() != vocab and vocab > VOCAB:
        raise RuntimeError(f"trained {tok.get_vocab_size()} tokens, not {vocab}")
    return tok


def to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def tensor_shapes(shape: Shape, vocab: int) -> dict[str, tuple[int, ...]]:
    h, ff, kv = shape.hidden, shape.intermediate, shape.kv_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
    }
    if not shape.tied:
        shapes["lm_head.weight"] = (vocab, h)
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (h, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (ff, h),
                p + "mlp.up_proj.weight": (ff, h),
                p + "mlp.down_proj.weight": (h, ff),
            }
        )
    return shapes


# numpy dtype -> safetensors dtype; uint16 arrays are bfloat16 bit patterns (to_bf16_bits).
SAFETENSORS_DTYPES = {
    np.dtype(np.uint16): "BF16",
    np.dtype(np.float16): "F16",
    np.dtype(np.float32): "F32",
    np.dtype(np.int32): "I32",
    np.dtype(np.int8): "I8",
    np.dtype(np.int64): "I64",
}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """safetensors: u64 header length, JSON header of offsets, then raw little-endian data.

    Each tensor's dtype follows its array's (SAFETENSORS_DTYPES): uint16 is BF16.
    """
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, data in tensors.items():
        size = data.nbytes
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[data.dtype],
            "shape": list(data.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for data in tensors.values():
            f.write(np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<")).tobytes())


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, in its header's order, as write_safetensors
    takes them (BF16 as uint16 bit patterns). The header is read through the model
    reader's gate (bounded and checked), each tensor by a read of its own span."""
    from zenvllm.core.model import safetensors_header  # the package tiny_model needs only here

    _, start, header = safetensors_header(path)
    dtypes = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}
    tensors = {}
    with path.open("rb") as f:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = dtypes.get(info.get("dtype"))
            if dtype is None:
                raise ValueError(f"{path}: tensor {name} is {info.get('dtype')}, not {set(dtypes)}")
            first, end = info["data_offsets"]
            if end - first != math.prod(info["shape"]) * dtype.itemsize:
                raise ValueError(f"{path}: tensor {name}'s span does not fit its shape and dtype")
            f.seek(start + first)
            raw = f.read(end - first)
            if len(raw) != end - first:
                raise ValueError(f"{path}: tensor {name} lies past the end: the file is truncated")
            data = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype)
            tensors[name] = data.reshape(info["shape"])
    return tensors


def float_weights(shape: Shape, vocab: int, seed: int = SEED) -> Iterator[tuple[str, np.ndarray]]:
    """The random weights in float32, one tensor at a time (norms are ones)."""
    rng = np.random.default_rng(seed)
    for name, dims in tensor_shapes(shape, vocab).items():
        if name.endswith("norm.weight"):
            yield name, np.ones(dims, dtype=np.float32)
        else:
            yield name, rng.normal(0.0, 0.02, size=dims).astype(np.float32)


def weights(shape: Shape, vocab: int, seed: int = SEED) -> dict[str, np.ndarray]:
    return {name: to_bf16_bits(values) for name, values in float_weights(shape, vocab, seed)}


def config(shape: Shape, vocab: int, bos: int, eos: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads or shape.heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_LEN,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "tie_word_embeddings": shape.tied,
        "torch_dtype": "bfloat16",
        "zenvllm_tiny_recipe": RECIPE,
    }


def write_model(directory: Path, shape: Shape) -> None:
    tok = train_tokenizer(shape.vocab)
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": MAX_LEN,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2)
    )
    (directory / "config.json").write_text(json.dumps(config(shape, vocab, bos, eos), indent=2))
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos, "eos_token_id": eos}, indent=2)
    )
    write_safetensors(directory / "model.safetensors", weights(shape, vocab))


def read_config(directory: Path) -> dict:
    """A model directory's config.json as an object; {} if missing, unreadable or not one."""
    try:
        cfg = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def is_current(directory: Path) -> bool:
    made = read_config(directory).get("zenvllm_tiny_recipe") == RECIPE
    return made and (directory / "model.safetensors").exists()


def made_here(directory: Path) -> bool:
    """A model directory these makers wrote (any recipe): its config carries the marker."""
    if directory.is_symlink() or not directory.is_dir():
        return False
    return "zenvllm_tiny_recipe" in read_config(directory)


def make_atomically(
    directory: Path,
    write: Callable[[Path], None],
    ours: Callable[[Path], bool] = made_here,
) -> None:
    """Fill a temporary sibling with `write`, then swap it in for `directory`, which
    must be absent or a model `ours` recognises (by default one made here): anything
    else there is never removed."""
    if (directory.exists() or directory.is_symlink()) and not ours(directory):
        raise SystemExit(
            f"{directory} exists and is not a model tests/support made; it stays as it is: "
            "give another directory, or move it away"
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}-"))
    try:
        write(tmp)
        # Readable by the image's non-root user when mounted read-only.
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_tiny_model(directory: Path | None = None, shape: str = "tiny") -> Path:
    """The model's directory, made (atomically) only if missing or stale."""
    directory = Path(directory) if directory else default_dir(SHAPES[shape])
    if not is_current(directory):
        make_atomically(directory, lambda tmp: write_model(tmp, SHAPES[shape]))
    return directory


if __name__ == "__main__":
    args = sys.argv[1:]
    chosen = "tiny"
    if args[:1] == ["--shape"]:
        chosen, args = args[1], args[2:]
    print(ensure_tiny_model(Path(args[0]) if args else None, chosen))
