"""A small causal language model trained here, whose next-token predictions mean
something: for quality beside speed (perplexity, greedy agreement) and speculative
decoding, which random weights cannot judge. No hub and no PyPI package ships one.

Trained inside the project's own vllm-openai image (torch, transformers and tokenizers
are there; the test venv has none of them), on text every image has: its Python's
standard library sources, in a fixed order, one file in ten held out. Deterministic:
seeded, one thread, the same steps. Byte-level BPE of VOCAB tokens, a 3-layer Llama
(hidden 192) and, for draft-model speculation, a 1-layer one on the same tokenizer
(draft/), bf16 weights as vLLM serves them, and beside them:

    trained.json    the corpus digest, the held-out perplexity of each model in float32
                    (the reference) and bf16 and of the same shape untrained, greedy
                    samples, the training time
    heldout.json    the held-out token ids those perplexities were measured on (CHUNKS
                    of SEQ tokens), for a served model to be measured on the same

    ensure_trained_model() -> Path          cached under $ZENVLLM_CACHE/models/
    python tests/support/trained_model.py [DIR]      (the one command; IMAGE must exist)

Run inside the image as `python trained_model.py --train OUT` (what ensure does).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

RECIPE = 2  # bump when the recipe changes: a cached model of another recipe is remade
NAME = "trained-llama"
IMAGE = "zenvllm/vllm-openai:0.32.0"
VOCAB = 2048
SEQ = 256
BATCH = 16
STEPS = 300
SEED = 20261128
SHAPE = {
    "hidden_size": 192,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "intermediate_size": 512,
}
DRAFT = {
    "hidden_size": 96,
    "num_hidden_layers": 1,
    "num_attention_heads": 3,
    "intermediate_size": 256,
}
CHUNKS = 8  # held-out chunks of SEQ tokens a served model is measured on
SPECIAL = ["<unk>", "<s>", "</s>"]
HERE = Path(__file__).resolve()


def corpus(root: Path) -> tuple[list[str], list[str], str]:
    """The standard library's .py files under `root`, sorted: (training texts, held-out
    texts, a digest of both), every tenth file held out."""
    files = sorted(p for p in root.rglob("*.py") if "test" not in p.parts and p.is_file())
    train, held, digest = [], [], hashlib.sha256()
    for i, path in enumerate(files):
        text = path.read_text(errors="replace")
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + text.encode())
        (held if i % 10 == 0 else train).append(text)
    return train, held, digest.hexdigest()[:16]


def train(out: Path) -> None:  # runs in the image
    import time

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    began = time.monotonic()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # the same sums, so the same weights, on every run
    root = Path(os.__file__).parent
    train_texts, held_texts, digest = corpus(root)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        train_texts,
        trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=SPECIAL,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    ids = [i for t in train_texts for i in [*tok.encode(t).ids, 2]]
    held = [i for t in held_texts for i in [*tok.encode(t).ids, 2]][: SEQ * 64]
    data = torch.tensor(ids)
    chunks = torch.tensor(held).view(-1, SEQ)
    record: dict = {
        "recipe": RECIPE,
        "corpus": f"Python {sys.version.split()[0]} stdlib .py, sha256 {digest}",
        "train_tokens": len(ids),
        "held_out_tokens": len(held),
        "batch": [BATCH, SEQ],
        "models": {},
    }
    for name, shape, steps, where in (
        ("main", SHAPE, STEPS, out),
        ("draft", DRAFT, STEPS // 2, out / "draft"),
    ):
        record["models"][name] = fit(tok, data, chunks, shape, steps, where)
        print(json.dumps({name: record["models"][name]["perplexity"]}), flush=True)
    for where in (out, out / "draft"):
        tok.save(str(where / "tokenizer.json"))
        (where / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "bos_token": "<s>",
                    "eos_token": "</s>",
                    "unk_token": "<unk>",
                    "model_max_length": 512,
                }
            )
        )
    (out / "heldout.json").write_text(json.dumps(chunks[:CHUNKS].tolist()) + "\n")
    record["seconds"] = round(time.monotonic() - began)
    (out / "trained.json").write_text(json.dumps(record, indent=2) + "\n")


def fit(tok, data, chunks, shape: dict, steps: int, out: Path) -> dict:  # in the image
    """A Llama of `shape` trained for `steps` on `data`, saved in bf16 to `out`; its
    perplexities on the held-out `chunks` and greedy samples."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        max_position_embeddings=512,
        num_key_value_heads=shape["num_attention_heads"],
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        **shape,
    )
    model = LlamaForCausalLM(config)

    def perplexity(rows) -> float:
        model.eval()
        with torch.no_grad():
            loss = model(input_ids=rows, labels=rows).loss.float().item()
        model.train()
        return float(torch.exp(torch.tensor(loss)))

    untrained = perplexity(chunks)
    starts = torch.randint(0, len(data) - SEQ - 1, (steps, BATCH))
    optim = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=2e-3, total_steps=steps)
    for step in range(steps):
        batch = torch.stack([data[s : s + SEQ] for s in starts[step].tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
        optim.zero_grad()
        if step % 50 == 0:
            print(f"{out.name} step {step}: loss {loss.item():.3f}", flush=True)
    trained, served = perplexity(chunks), perplexity(chunks[:CHUNKS])
    samples = {}
    for prompt in ("def main():\n    ", "import os\n\n\nclass "):
        start = torch.tensor([tok.encode(prompt).ids])
        made = model.generate(start, max_new_tokens=24, do_sample=False)
        samples[prompt] = tok.decode(made[0].tolist()[start.shape[1] :])
    model.to(torch.bfloat16)
    in_bf16 = perplexity(chunks[:CHUNKS])
    model.save_pretrained(out, safe_serialization=True)
    return {
        "shape": shape,
        "steps": steps,
        "perplexity": {
            "trained": round(trained, 3),
            "untrained": round(untrained, 3),
            # on heldout.json's chunks, as a served model is measured
            "heldout_float32": round(served, 4),
            "heldout_bfloat16": round(in_bf16, 4),
        },
        "greedy_samples": samples,
    }


def cache_dir() -> Path:
    return Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm")) / "models" / NAME


def is_current(directory: Path) -> bool:
    try:
        return json.loads((directory / "trained.json").read_text())["recipe"] == RECIPE
    except (OSError, ValueError, KeyError):
        return False


def ensure_trained_model(directory: Path | None = None) -> Path:
    """The trained model, made once in IMAGE and cached; remade for another recipe."""
    sys.path.insert(0, str(HERE.parent.parent))
    from support import engine

    directory = directory or cache_dir()
    if is_current(directory):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=directory.parent))
    try:
        work.chmod(0o777)  # the image's user writes it
        engine.docker(
            "run",
            "--rm",
            "--network=none",
            "--user=0",
            f"--volume={HERE}:/train.py:ro",
            f"--volume={work}:/out",
            "--entrypoint",
            "python",
            IMAGE,
            "/train.py",
            "--train",
            "/out",
            timeout=3600,
        )
        for path in (work, *work.rglob("*")):  # torch writes its weights 0600
            path.chmod(0o755 if path.is_dir() else 0o644)  # vLLM's user reads them
        shutil.rmtree(directory, ignore_errors=True)
        work.rename(directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return directory


if __name__ == "__main__":
    if sys.argv[1:2] == ["--train"]:
        train(Path(sys.argv[2]))
    else:
        made = ensure_trained_model(Path(sys.argv[1]) if sys.argv[1:] else None)
        print(made)
        print((made / "trained.json").read_text())
