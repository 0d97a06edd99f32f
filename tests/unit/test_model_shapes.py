"""The bench models' shapes: the real ones match the published models' parameter counts."""

from __future__ import annotations

import math

import pytest
from support.tiny_model import SHAPES, tensor_shapes


def parameters(name: str) -> int:
    shape = SHAPES[name]
    return sum(math.prod(dims) for dims in tensor_shapes(shape, shape.vocab).values())


@pytest.mark.parametrize(
    ("name", "published"),
    [("qwen0.5b", 494_032_768), ("qwen1.5b", 1_543_714_304)],  # Qwen2.5's model cards
)
def test_real_shapes_have_the_published_models_parameter_counts(name, published):
    # Qwen2.5 also has q/k/v biases (0.2 % of the weights); these Llamas do not.
    assert parameters(name) == pytest.approx(published, rel=0.003)


def test_real_shapes_use_grouped_query_attention_and_tied_embeddings():
    shape = SHAPES["qwen0.5b"]
    dims = tensor_shapes(shape, shape.vocab)
    assert dims["model.layers.0.self_attn.k_proj.weight"] == (2 * 64, 896)
    assert dims["model.layers.0.self_attn.q_proj.weight"] == (896, 896)
    assert "lm_head.weight" not in dims and dims["model.embed_tokens.weight"] == (151936, 896)
    assert SHAPES["tiny"].kv_dim == SHAPES["tiny"].hidden  # the small ones stay as they were
