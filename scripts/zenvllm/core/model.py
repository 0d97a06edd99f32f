"""What the planner needs to know of a model: its weight bytes and KV bytes per token.

Read from a local Hugging Face model directory (config.json and the safetensors
headers, never the tensors) or given as a bare size. Standard library only.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.core.host import GIB
from zenvllm.core.quantization import Quantization
from zenvllm.core.quantization import read as read_quantization

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# vLLM's runners (`--runner`): a model that generates tokens, or one that pools its
# hidden states into an embedding or a score (encoders, cross-encoders, rerankers).
GENERATE, POOLING = "generate", "pooling"
# Architecture suffixes, as vLLM's registry reads them: a pooling head, a generating one.
POOLING_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForRewardModel")
GENERATING_HEADS = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")
ALIASES = {"float": "float32", "half": "float16"}  # config.json's other spellings
# safetensors' names of the floating dtypes vLLM converts to the dtype it serves in.
FLOATING = ("BF16", "F16", "F32", "F64")


@dataclass(frozen=True)
class Model:
    name: str
    weight_bytes: int
    kv_bytes_per_token: int | None = None  # None: only the size is known
    max_model_len: int | None = None  # the config's max_position_embeddings
    quantization: Quantization | None = None  # None: bf16 or other unquantized weights
    dtype: str = "bfloat16"  # what the floating weights and the KV cache are counted in
    float_bytes: int | None = None  # bytes of floating tensors (None: all of weight_bytes)
    runner: str = GENERATE  # vLLM's --runner: GENERATE, or POOLING (no decode, no KV cache)
    runner_why: str = ""  # what in config.json (and modules.json) decided it
    # The longest context vLLM serves it at, and what says so (None: not known here).
    context_limit: int | None = None
    context_source: str = ""

    @property
    def weight_gib(self) -> float:
        return self.weight_bytes / GIB


CONFIG_FIX = "fix the model's config.json (it must match the weights)"
SENTENCE_FIX = "fix the model's sentence_bert_config.json (sentence-transformers')"
WEIGHTS_FIX = "download or convert it again"
MAX_MODEL_GIB = 1 << 20  # 1 PiB: beyond any host's memory


def model_of_size(gib: float, name: str | None = None) -> Model:
    if not 0 < gib <= MAX_MODEL_GIB:
        raise UserError(
            f"--model-size-gib {gib:g} is not a size in (0, {MAX_MODEL_GIB}] GiB; "
            "give the weights in GiB, e.g. 16"
        )
    return Model(name=name or f"{gib:g} GiB model", weight_bytes=int(gib * GIB))


MAX_CONFIG_INT = 1 << 40  # above any real layer, head, width or context count


def config_int(config: dict[str, Any], key: str, where: str = "config.json") -> int | None:
    """A positive integer field, None when absent; anything else is refused by name."""
    value = config.get(key)
    if value is None:
        return None
    return gate.whole(value, f"{where}: {key}", 1, MAX_CONFIG_INT, CONFIG_FIX)


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int) -> int | None:
    """K and V bytes per token: layers x KV heads x head_dim x 2 x bytes per element.

    MLA (DeepSeek's kv_lora_rank) caches one compressed latent per layer instead.
    Sliding-window layers are counted in full: an upper bound. None when the
    config lacks the fields (an unusual architecture): the plan is then size-only.
    """
    where = "config.json: text_config" if "text_config" in config else "config.json"
    text = gate.obj(config.get("text_config", config), where, CONFIG_FIX)  # multimodal nests
    layers = config_int(text, "num_hidden_layers", where)
    rank = config_int(text, "kv_lora_rank", where)
    if layers and rank:
        rope = config_int(text, "qk_rope_head_dim", where) or 0
        return layers * (rank + rope) * dtype_bytes
    heads = config_int(text, "num_attention_heads", where)
    kv_heads = config_int(text, "num_key_value_heads", where) or heads
    hidden = config_int(text, "hidden_size", where)
    head_dim = config_int(text, "head_dim", where) or (
        hidden // heads if hidden and heads else None
    )
    if not (layers and kv_heads and head_dim):
        return None
    return layers * kv_heads * head_dim * 2 * dtype_bytes


def safetensors_header(path: Path) -> tuple[int, int, dict[str, Any]]:
    """(file size, where the tensor data starts, the header as a JSON object), read
    through the gate: at most safetensors' own header limit, never the tensors."""
    fix = WEIGHTS_FIX
    with gate.regular(path, fix) as (f, size):
        head = f.read(8)
        if len(head) < 8:
            raise gate.InputError(
                f"{path}: {size} bytes, too short for a safetensors header; {fix}"
            )
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, gate.SAFETENSORS_HEADER):
            raise gate.InputError(
                f"{path}: its header claims {header_len:,} bytes but the file has {size:,} "
                f"(safetensors allows at most {gate.SAFETENSORS_HEADER:,}); the file is "
                f"truncated or not safetensors; {fix}"
            )
        raw = f.read(header_len)
    where = f"{path} (header)"
    header = gate.obj(gate.parse_json(gate.decode(raw, where, fix), where, fix), where, fix)
    return size, 8 + header_len, header


def safetensors_spans(path: Path) -> tuple[int, list[tuple[int, int]]]:
    """Where one .safetensors file's tensor data starts, and each tensor's byte span in it."""
    data_start, tensors = safetensors_tensors(path)
    return data_start, [(start, end) for start, end, _ in tensors]


def safetensors_tensors(path: Path) -> tuple[int, list[tuple[int, int, str]]]:
    """Where one .safetensors file's tensor data starts, and each tensor's byte span and
    dtype in it, sorted by span.

    A download cut short is the commonest broken model: the header must parse, every
    tensor must lie inside the file and no two may share bytes, or the user hears which
    file and why."""
    fix = WEIGHTS_FIX
    size, data_start, header = safetensors_header(path)
    data = size - data_start
    spans = []
    for key, tensor in header.items():
        if key == "__metadata__":
            continue
        where = f"{path}: tensor {key[:60]!r}"
        offsets = gate.items(
            gate.obj(tensor, where, fix).get("data_offsets"), f"{where} data_offsets", fix
        )
        if len(offsets) != 2:
            raise gate.InputError(f"{where}: data_offsets must be [start, end]; {fix}")
        start, end = (gate.whole(o, f"{where} data_offsets", 0, 1 << 62, fix) for o in offsets)
        if not start <= end:
            raise gate.InputError(f"{where}: data_offsets {offsets} end before they start; {fix}")
        spans.append((start, end, str(tensor.get("dtype", ""))))
    if any(end > data for _, end, _ in spans):
        last = max(end for _, end, _ in spans)
        raise gate.InputError(
            f"{path}: tensors need {last:,} bytes of data but the file holds {data:,}; "
            f"the file is truncated; {fix}"
        )
    spans.sort()
    for (_, end, _), (start, _, _) in itertools.pairwise(spans):
        if start < end:
            raise gate.InputError(
                f"{path}: two tensors share bytes {start:,} to {end:,} of its data; "
                f"the header is corrupt; {fix}"
            )
    return data_start, spans


def safetensors_bytes(path: Path) -> tuple[int, int]:
    """Bytes of tensor data in one .safetensors file (each byte counted once), and of its
    floating tensors (not packed integers), from one read of its header."""
    tensors = safetensors_tensors(path)[1]
    every = sum(end - start for start, end, _ in tensors)
    return every, sum(end - start for start, end, dtype in tensors if dtype in FLOATING)


def shards(path: Path) -> list[Path]:
    """The safetensors files vLLM loads. With an index, exactly the shards it names (as
    vLLM does: a stale extra shard beside it is not counted), each of which must exist."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        fix = "re-download it"
        data = gate.obj(gate.read_json(index, gate.DOCUMENT, fix), str(index), fix)
        weight_map = gate.obj(data.get("weight_map"), f"{index}: weight_map", fix)
        named = sorted(
            {gate.text(n, f"{index}: weight_map[{k[:40]!r}]", fix) for k, n in weight_map.items()}
        )
        if not named or not all(n and "/" not in n and n not in (".", "..") for n in named):
            raise gate.InputError(f"{index}: shard names must be file names; {fix}")
        missing = [n for n in named if not (path / n).exists()]
        if missing:
            raise UserError(
                f"{index} names {len(named)} shard(s) but {len(missing)} are missing "
                f"({', '.join(missing[:3])}); finish the download"
            )
        return [path / n for n in named]
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


def runner_of(config: dict[str, Any], modules: Any) -> tuple[str, str]:
    """Whether vLLM runs the model as a generator or a pooler, and why. A classification
    head scores (a cross-encoder, a reranker); a sentence-transformers Pooling module
    embeds (even over a decoder: vLLM converts it); a language-model head generates; a
    bare backbone (BertModel, XLMRobertaModel: no head at all) can only pool."""
    names = config.get("architectures")
    archs = [a for a in names if isinstance(a, str)] if isinstance(names, list) else []
    shown = ", ".join(archs) or "no architectures"
    if any(a.endswith(POOLING_HEADS) for a in archs):
        return POOLING, f"{shown}: a classification head, served for scores (/score, /rerank)"
    pooled = isinstance(modules, list) and any(
        isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling") for m in modules
    )
    if pooled:
        return POOLING, f"{shown} with a sentence-transformers Pooling module: embeddings"
    if any(a.endswith(GENERATING_HEADS) for a in archs) or not archs:
        return GENERATE, f"{shown}: a language-model head generates tokens"
    if all(a.endswith("Model") for a in archs):
        return POOLING, f"{shown}: a backbone without a head, served for embeddings"
    return GENERATE, f"{shown}: not a pooling architecture vLLM names"


def context_limit(
    config: dict[str, Any], sentence: dict[str, Any] | None
) -> tuple[int | None, str]:
    """The longest context vLLM serves the model at, and what says so: the positions it
    has, and a sentence-transformers model's max_seq_length, which vLLM holds a pooling
    model to. None when a rope scaling stretches the positions (vLLM's own arithmetic)."""
    limits = []
    positions = config_int(config, "max_position_embeddings")
    if positions and not config.get("rope_scaling"):
        limits.append((positions, "config.json's max_position_embeddings"))
    longest = (sentence or {}).get("max_seq_length")
    if longest is not None:
        where = "sentence_bert_config.json: max_seq_length"
        limits.append((gate.whole(longest, where, 1, MAX_CONFIG_INT, SENTENCE_FIX), where))
    return min(limits) if limits else (None, "")


def read_model(path: Path) -> Model:
    """Size a local model directory as stored (core/dtype.py sizes it as served)."""
    config_file = path / "config.json"
    if not config_file.exists():  # a FIFO or device is the gate's to refuse
        raise UserError(
            f"--model {path}: no config.json there; give a local Hugging Face model "
            "directory, or --model-size-gib N when only the size is known"
        )
    config = gate.obj(
        gate.read_json(config_file, gate.DOCUMENT, CONFIG_FIX),
        f"--model {path}: config.json",
        CONFIG_FIX,
    )
    modules_file = path / "modules.json"  # sentence-transformers' pipeline, where there is one
    modules = gate.read_json(
        modules_file, gate.DOCUMENT, "fix the model's modules.json (sentence-transformers')", True
    )
    runner, runner_why = runner_of(config, modules)
    sentence_file = path / "sentence_bert_config.json"  # sentence-transformers' limits
    sentence = gate.read_json(sentence_file, gate.DOCUMENT, SENTENCE_FIX, True)
    if sentence is not None:
        sentence = gate.obj(sentence, f"--model {path}: {sentence_file.name}", SENTENCE_FIX)
    sizes = [safetensors_bytes(f) for f in shards(path)]  # (all bytes, floating) per shard
    given = config.get("torch_dtype") or config.get("dtype")
    dtype = ALIASES.get(given, given) if isinstance(given, str) else None
    dtype = dtype if dtype in DTYPE_BYTES else "bfloat16"  # absent, or a value vLLM refuses
    try:
        kv = kv_bytes_per_token(config, DTYPE_BYTES[dtype])
        max_len = config_int(config, "max_position_embeddings")
        limit, limit_source = context_limit(config, sentence)
        quantization = read_quantization(config, "config.json")
    except UserError as err:
        raise UserError(f"--model {path}: {err}") from None
    return Model(
        name=path.name,
        weight_bytes=sum(every for every, _ in sizes),
        kv_bytes_per_token=kv if runner == GENERATE else None,  # a pooler caches no K and V
        max_model_len=max_len,
        quantization=quantization,
        dtype=dtype,
        float_bytes=sum(floating for _, floating in sizes),
        runner=runner,
        runner_why=runner_why,
        context_limit=limit,
        context_source=limit_source,
    )
