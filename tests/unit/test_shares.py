"""Several models on one host (core/shares.py): each model's instances on cores and
memory no other model's use, sized by each model's share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.tiny_model import ensure_tiny_model

from zenvllm.core.cores import usable_cores
from zenvllm.core.errors import PlanError
from zenvllm.core.flavors import synthetic_host
from zenvllm.core.host import GIB
from zenvllm.core.model import POOLING, Model
from zenvllm.core.model_list import Share
from zenvllm.core.plan import Policy
from zenvllm.core.shares import counts, divide, plan_models
from zenvllm.core.topology import read_host

TWO_SOCKETS = read_host(Path(__file__).parents[1] / "fixtures" / "hosts" / "epyc-9354-2s-smt")
CHAT = Model("chat", 15 * GIB, kv_bytes_per_token=128 * 1024)
EMBED = Model("minilm", 90 << 20, runner=POOLING, runner_why="BertModel: embeddings")


def cpus_of(plan) -> set[int]:
    return {c for i in plan.instances for c in i.cpus}


def test_a_chat_model_and_an_embedder_share_the_host_without_sharing_a_core():
    policies = [Policy(name_prefix="site"), Policy(name_prefix="site")]
    chat, embed = plan_models(TWO_SOCKETS, [CHAT, EMBED], [Share("chat"), Share("embed")], policies)
    assert cpus_of(chat).isdisjoint(cpus_of(embed))
    assert cpus_of(chat) | cpus_of(embed) <= set(TWO_SOCKETS.allowed_cpus)
    # By weight bytes: 15 GiB against 90 MiB leaves the embedder its floor of one core
    # (both SMT siblings), on the last node, and the chat model the other 63.
    assert len(cpus_of(embed)) == 2 and all(i.node == 1 for i in embed.instances)
    # One deployment's instances, numbered on from one model to the next: names and ports.
    names = [i.name for p in (chat, embed) for i in p.instances]
    assert names == [f"site-{n}" for n in range(len(names))]
    assert [i.port for p in (chat, embed) for i in p.instances] == [
        Policy().base_port + n for n in range(len(names))
    ]
    assert chat.notes[0].startswith("chat: 63 of 64 physical cores (its 15.00 GiB of weights)")
    assert embed.notes[0].startswith("embed: 1 of 64 physical cores")


def test_asked_cores_and_weights_size_the_parts():
    shares = [Share("chat", weight=3), Share("embed", cores=16), Share("rerank", weight=1)]
    assert counts(64, [CHAT, EMBED, EMBED], shares) == [36, 16, 12]
    parts = divide(TWO_SOCKETS, [CHAT, EMBED, EMBED], shares)
    held = [usable_cores(part) for part, _ in parts]
    assert [sum(len(c) for c in h.values()) for h in held] == [36, 16, 12]
    # In order, each filling a node before the next: chat spills onto node 1.
    assert [sorted(h) for h in held] == [[0, 1], [1], [1]]


def test_each_part_holds_its_share_of_each_nodes_memory():
    parts = divide(TWO_SOCKETS, [CHAT, EMBED], [Share("chat", cores=48), Share("embed")])
    for node in TWO_SOCKETS.nodes:
        total = sum(part.node(node.id).mem_total_bytes for part, _ in parts)
        assert node.mem_total_bytes - len(parts) <= total <= node.mem_total_bytes
    embed_part = parts[1][0]
    assert embed_part.node(0).mem_total_bytes == 0  # it holds no core on node 0
    assert embed_part.allowed_mems == {1}


@pytest.mark.parametrize(
    ("shares", "says"),
    [
        ([Share("chat", cores=64), Share("embed")], "ask for 64 core(s) and 1 more"),
        ([Share("chat"), Share("chat")], "two models share a served name"),
    ],
)
def test_shares_the_host_cannot_give_are_refused_with_the_numbers(shares, says):
    with pytest.raises(PlanError) as refused:
        divide(TWO_SOCKETS, [CHAT, EMBED], shares)
    assert says in str(refused.value)


def test_a_two_core_machine_gives_each_of_two_models_one_core():
    host = synthetic_host("vcpus=2,ram_gib=24,numa=1,smt=1,cpu=genoa")
    tiny = Model("tiny", 2 << 20, kv_bytes_per_token=16 * 1024)
    policies = [Policy(name_prefix="a"), Policy(name_prefix="b")]
    chat, embed = plan_models(host, [tiny, EMBED], [Share("a"), Share("b")], policies)
    assert len(cpus_of(chat)) == len(cpus_of(embed)) == 1
    assert cpus_of(chat).isdisjoint(cpus_of(embed))


def test_zenvllm_plan_takes_several_models_each_named(tmp_path):
    from test_cli_plan import zenvllm
    from test_pooling import BERT, ST_MODULES, encoder_dir

    (tmp_path / "embed").mkdir()
    embedder = encoder_dir(tmp_path / "embed", BERT, ST_MODULES)
    chat = ensure_tiny_model()
    root = str(Path(__file__).parents[1] / "fixtures" / "hosts" / "epyc-9354-2s-smt")
    done = zenvllm(
        "plan", "--json", "--root", root, "--deployment", "site",
        "--model", f"chat={chat}", "--model", f"embed={embedder}", "--share", "embed=cores:4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [m["served_name"] for m in doc["models"]] == ["chat", "embed"]
    assert [m["runner"] for m in doc["models"]] == ["generate", "pooling"]
    by_name = {i["name"]: i for i in doc["instances"]}
    cpus = [{c for n in m["instances"] for c in by_name[n]["cpus"]} for m in doc["models"]]
    assert cpus[0].isdisjoint(cpus[1]) and len(cpus[1]) == 8  # 4 cores and their siblings
    # One document: the whole host, every instance with its container, ports apart.
    assert sorted(doc["host"]["allowed_cpus"]) == sorted(doc["host"]["cpus"])
    assert sorted(by_name) == sorted(n for m in doc["models"] for n in m["instances"])
    ports = [i["port"] for i in doc["instances"]]
    assert len(set(ports)) == len(ports)
    assert doc["max_concurrency"] == sum(m["max_concurrency"] for m in doc["models"])
    assert all(n.startswith(("chat: ", "embed: ")) for n in doc["notes"]), doc["notes"]
    (embed_name,) = doc["models"][1]["instances"]
    container = by_name[embed_name]["container"]
    assert container["served_model_name"] == "embed"
    assert "--label=zenvllm.deployment=site" in container["run_args"]  # one deployment
    assert f"--model={embedder}" not in container["command"]  # the container's own mount
    assert by_name["site-0"]["container"]["served_model_name"] == "chat"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--model", "chat=/m/a", "--model", "/m/b"], "with several models each is NAME=DIR"),
        (["--model", "/m/a", "--share", "a=cores:2"], "shares divide the host between"),
        (["--model", "a=/m/a", "--model", "b=/m/b", "--share", "c=cores:1"], "names c, which no"),
        (["--model", "a=/m/a", "--share", "a=cores:0"], "is not NAME=cores:N or NAME=weight:W"),
    ],
)
def test_several_models_asked_wrongly_are_refused_with_the_fix(args, says):
    from test_cli_plan import zenvllm

    root = str(Path(__file__).parents[1] / "fixtures" / "hosts" / "epyc-9354-2s-smt")
    done = zenvllm("plan", "--root", root, *args)
    assert done.returncode == 2, done.stdout
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_one_model_whose_path_holds_an_equals_sign_is_that_path(tmp_path):
    from test_cli_plan import zenvllm

    odd = tmp_path / "models" / "qwen=0.5b"
    odd.parent.mkdir()
    ensure_tiny_model(odd)
    root = str(Path(__file__).parents[1] / "fixtures" / "hosts" / "epyc-9354-2s-smt")
    done = zenvllm("plan", "--json", "--root", root, "--model", str(odd))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"]["name"] == "qwen=0.5b"


def test_check_mode_plans_each_model_from_the_copy_staged_for_it(tmp_path):
    """The instances role in check mode, on a host without the models yet: each is read
    from the copy staged for it (--read-model DIR=STAGED) and planned as at DIR."""
    from test_cli_plan import zenvllm
    from test_pooling import BERT, ST_MODULES, encoder_dir

    staged = tmp_path / "zenvllm-plan.x"
    (staged / "model-1").mkdir(parents=True)
    encoder_dir(staged / "model-1", BERT, ST_MODULES)
    ensure_tiny_model(staged / "model-0")
    chat, embed = "/srv/absent/qwen", "/srv/absent/minilm=v2"  # "=" in a DIR is its own
    root = str(Path(__file__).parents[1] / "fixtures" / "hosts" / "epyc-9354-2s-smt")
    models = ["plan", "--json", "--root", root, "--model", f"chat={chat}"]
    models += ["--model", f"embed={embed}"]
    refused = zenvllm(*models)
    assert refused.returncode == 2 and f"--model {chat}: no config.json there" in refused.stderr

    staging = [f"--read-model={chat}={staged}/model-0", f"--read-model={embed}={staged}/model-1"]
    done = zenvllm(*models, *staging)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    got = [(m["served_name"], m["name"], m["runner"]) for m in doc["models"]]
    assert got == [("chat", "qwen", "generate"), ("embed", "minilm=v2", "pooling")]
    volumes = {a for i in doc["instances"] for a in i["container"]["run_args"] if "--volume=" in a}
    assert {f"--volume={d}:/model:ro" for d in (chat, embed)} <= volumes, volumes
    assert str(staged) not in done.stdout  # the copy is only read


@pytest.mark.parametrize(
    ("read", "says"),
    [
        ("/srv/absent/qwen", "is not DIR=STAGED"),
        ("/srv/other=/tmp/x", "--read-model /srv/other=...: no model of the request is in"),
    ],
)
def test_a_staged_copy_for_no_model_of_the_request_is_refused(read, says):
    from test_cli_plan import zenvllm

    root = str(Path(__file__).parents[1] / "fixtures" / "hosts" / "epyc-9354-2s-smt")
    done = zenvllm("plan", "--root", root, "--model", "/srv/absent/qwen", "--read-model", read)
    assert done.returncode == 2, done.stdout
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
