"""Pooling models (embedding encoders, cross-encoders): told from generators by their
config.json and sentence-transformers files, as vLLM's runner does, and planned for
what they are: no decode step to keep under a target, no KV cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_model import write_safetensors

from zenvllm.core import plan_doc
from zenvllm.core.errors import PlanError, UserError
from zenvllm.core.flavors import synthetic_host
from zenvllm.core.model import GENERATE, POOLING, Model, read_model, runner_of
from zenvllm.core.plan import Policy, make_plan
from zenvllm.runtime import launcher

ST_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]
BERT = {
    "architectures": ["BertModel"],
    "model_type": "bert",
    "hidden_size": 384,
    "num_attention_heads": 12,
    "num_hidden_layers": 6,
    "max_position_embeddings": 512,
}


@pytest.mark.parametrize(
    ("archs", "modules", "runner", "says"),
    [
        (["BertModel"], ST_MODULES, POOLING, "Pooling module: embeddings"),
        (["BertModel"], None, POOLING, "a backbone without a head"),
        (["XLMRobertaModel"], None, POOLING, "a backbone without a head"),
        (["BertForSequenceClassification"], None, POOLING, "/score, /rerank"),
        (["Qwen3ForCausalLM"], ST_MODULES, POOLING, "Pooling module: embeddings"),
        (["Qwen2ForCausalLM"], None, GENERATE, "a language-model head"),
        (["LlavaForConditionalGeneration"], None, GENERATE, "a language-model head"),
        (None, None, GENERATE, "no architectures"),
        (["MysteryNet"], None, GENERATE, "not a pooling architecture"),
    ],
)
def test_the_runner_is_read_as_vllm_reads_it(archs, modules, runner, says):
    config = {} if archs is None else {"architectures": archs}
    got, why = runner_of(config, modules)
    assert got == runner and says in why, why


def encoder_dir(tmp_path: Path, config: dict, modules: list | None) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    if modules is not None:
        (tmp_path / "modules.json").write_text(json.dumps(modules))
    write_safetensors(tmp_path / "model.safetensors", {"embeddings": 90 << 20})
    return tmp_path


def minilm_dir(model: Path) -> Path:
    """A sentence-transformers MiniLM directory at `model` (made): the bench tests' encoder."""
    model.mkdir()
    encoder_dir(model, BERT, ST_MODULES)
    (model / "1_Pooling").mkdir()
    (model / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True})
    )
    (model / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    return model


def test_an_encoder_is_read_without_a_kv_cache(tmp_path):
    model = read_model(encoder_dir(tmp_path, BERT, ST_MODULES))
    assert model.runner == POOLING and model.kv_bytes_per_token is None
    assert model.weight_bytes == 90 << 20 and model.max_model_len == 512


@pytest.mark.parametrize(
    ("config", "sentence", "limit", "source"),
    [
        (BERT, {"max_seq_length": 256}, 256, "sentence_bert_config.json: max_seq_length"),
        (BERT, None, 512, "config.json's max_position_embeddings"),
        (BERT | {"max_position_embeddings": 128}, {"max_seq_length": 256}, 128, "config.json"),
        # A rope scaling stretches the positions by vLLM's own arithmetic: not checked here.
        (BERT | {"rope_scaling": {"type": "yarn", "factor": 4.0}}, None, None, ""),
    ],
)
def test_the_longest_context_is_what_vllm_holds_the_model_to(
    tmp_path, config, sentence, limit, source
):
    path = encoder_dir(tmp_path, config, ST_MODULES)
    if sentence is not None:
        (path / "sentence_bert_config.json").write_text(json.dumps(sentence))
    model = read_model(path)
    assert model.context_limit == limit and model.context_source.startswith(source)
    host = synthetic_host("vcpus=8,ram_gib=32,numa=1,smt=1,cpu=genoa")
    if limit is None:
        assert make_plan(host, model, Policy(max_model_len=1 << 16)).max_model_len == 1 << 16
        return
    assert make_plan(host, model, Policy(max_model_len=limit)).max_model_len == limit
    # One token more: refused with the numbers (vLLM refused it at every start, the
    # container restarting until the deploy gave up).
    with pytest.raises(PlanError) as refused:
        make_plan(host, model, Policy(max_model_len=limit + 1))
    message = str(refused.value)
    assert f"max_model_len {limit + 1} is over the {limit} tokens" in message
    assert source in message and f"give {limit} or less, or 0" in message


def test_a_foreign_sentence_transformers_config_is_refused_by_name(tmp_path):
    path = encoder_dir(tmp_path, BERT, ST_MODULES)
    for text in ("[256]", '{"max_seq_length": "long"}', "{not json"):
        (path / "sentence_bert_config.json").write_text(text)
        with pytest.raises(UserError, match=r"sentence_bert_config\.json"):
            read_model(path)


def test_a_foreign_modules_file_is_refused_by_name(tmp_path):
    path = encoder_dir(tmp_path, BERT, None)
    (path / "modules.json").write_text("{not json")
    with pytest.raises(Exception, match=r"modules\.json"):
        read_model(path)


def test_an_encoder_gets_one_instance_per_node_and_no_kv_cache():
    host = synthetic_host("vcpus=128,ram_gib=512,numa=2,smt=2,cpu=genoa")
    encoder = Model("minilm", 90 << 20, runner=POOLING, runner_why="BertModel: embeddings")
    plan = make_plan(host, encoder, Policy())
    assert [i.node for i in plan.instances] == [0, 1]  # one per node, every core
    assert all(i.kv_cache_gib == 0 for i in plan.instances)
    assert all(i.env["VLLM_CPU_KVCACHE_SPACE"] == "0" for i in plan.instances)
    assert any("has no decode step" in n and "BertModel" in n for n in plan.notes), plan.notes
    # The same bytes as a generator: many small replicas, each with a KV cache.
    decoder = make_plan(host, Model("tiny", 90 << 20, kv_bytes_per_token=1 << 14), Policy())
    assert len(decoder.instances) > 2 and decoder.instances[0].kv_cache_gib >= 1


def test_the_plan_json_and_the_container_say_pooling(tmp_path):
    host = synthetic_host("vcpus=8,ram_gib=32,numa=1,smt=1,cpu=genoa")
    model = read_model(encoder_dir(tmp_path, BERT, ST_MODULES))
    doc = plan_doc.one(make_plan(host, model, Policy()))
    assert doc["model"]["runner"] == POOLING
    (instance,) = doc["instances"]
    assert instance["runner"] == POOLING
    assert "--runner=pooling" in instance["container"]["command"]
    generator = plan_doc.one(make_plan(host, Model("tiny", 90 << 20), Policy()))
    assert generator["model"]["runner"] == GENERATE
    command = generator["instances"][0]["container"]["command"]
    assert not any(a.startswith("--runner") for a in command)


def test_a_node_too_small_for_an_encoder_is_refused_without_a_kv_minimum():
    host = synthetic_host("vcpus=4,ram_gib=4,numa=1,smt=1,cpu=genoa")
    with pytest.raises(Exception, match="KV 0 GiB minimum"):
        make_plan(host, Model("big-encoder", 6 << 30, runner=POOLING), Policy())


def test_a_bare_docker_run_of_an_encoder_asks_vllm_for_the_pooling_runner(tmp_path):
    (tmp_path / "enc").mkdir()
    encoder = encoder_dir(tmp_path / "enc", BERT, ST_MODULES)
    host = synthetic_host("vcpus=8,ram_gib=32,numa=1,smt=1,cpu=genoa")
    serve = launcher.parse_args(["--model", str(encoder), "--port", "8000"])
    *_, model = launcher.plan_env(host, serve, "vllm-openai")  # the model read once
    added = launcher.with_runner(serve, model)
    assert added.rest == ["--port", "8000", "--runner=pooling"]
    given = launcher.parse_args(["--model", str(encoder), "--runner", "generate"])
    assert launcher.with_runner(given, model) == given  # the caller's own choice stands
    assert launcher.with_runner(serve, None) == serve  # a refused plan adds nothing
    (tmp_path / "gen").mkdir()
    generator = encoder_dir(tmp_path / "gen", {**BERT, "architectures": ["BertLMHeadModel"]}, None)
    plain = launcher.parse_args(["--model", str(generator)])
    assert launcher.with_runner(plain, read_model(generator)) == plain
