"""A sentence-transformers model directory -> the ONNX directory infinity serves.

infinity's docs advise its ONNX engine on a CPU, which needs an ONNX file beside the
model's config and tokenizer. The peer's image exports one with its own optimum (the
exporter the maintainers lock, `main_export`, the TorchScript exporter that optimum
1.24 was written for: torch 2.9 and later default to the dynamo one, which needs
onnxscript), copies the model's sentence-transformers files, then lets infinity run
its own ONNX graph optimisation once (what it does at every start when the directory
is writable; served read-only, it loads the optimised file). Cached under
$ZENVLLM_CACHE/onnx, one directory per model and weights, like the GGUF files.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.runtime.engine import DOCKER

# Part of the cache key: a change to what the export writes makes a new directory.
EXPORT_VERSION = 1
SOURCE = "/source"  # the model, read-only, in the export's container
MOUNT = "/model"  # the ONNX directory: where it is made and where infinity serves it
DONE = "model_optimized.onnx"  # the last file the export writes
# Run by the image's Python, as its user, without network.
EXPORT = f"""
import functools, shutil, sys
from pathlib import Path
import torch.onnx
torch.onnx.export = functools.partial(torch.onnx.export, dynamo=False)
from optimum.exporters.onnx import main_export
main_export("{SOURCE}", output="{MOUNT}", task="feature-extraction", library_name="transformers")
source = Path("{SOURCE}")
for path in source.iterdir():
    if path.name in ("modules.json", "sentence_bert_config.json") or path.name.endswith("_Pooling"):
        copy = shutil.copytree if path.is_dir() else shutil.copy
        copy(path, Path("{MOUNT}", path.name))
from infinity_emb.args import EngineArgs
from infinity_emb.transformer.embedder.optimum import OptimumEmbedder
OptimumEmbedder(engine_args=EngineArgs(model_name_or_path="{MOUNT}", engine="optimum",
                device="cpu", pooling_method=sys.argv[1], bettertransformer=False))
assert Path("{MOUNT}", "{DONE}").is_file(), "infinity did not optimise the ONNX graph"
"""


def sentence_transformers(model_dir: Path) -> tuple[str, int | None]:
    """(pooling, max_seq_length): the model's Pooling module ('mean' or 'cls', what
    infinity's --pooling-method takes) and its sentence_bert_config's longest input
    (vLLM refuses a longer --max-model-len for such a model); None where it says none."""
    fix = "give a sentence-transformers model (modules.json with a Pooling module)"
    modules = gate.read_json(model_dir / "modules.json", gate.DOCUMENT, fix, optional=True)
    pooling = next(
        (
            m
            for m in modules or []
            if isinstance(m, dict) and str(m.get("type")).endswith("Pooling")
        ),
        None,
    )
    if pooling is None:
        raise UserError(f"{model_dir}: no sentence-transformers Pooling module; {fix}")
    where = model_dir / str(pooling.get("path", "")) / "config.json"
    config = gate.read_json(where, gate.DOCUMENT, fix)
    if config.get("pooling_mode_mean_tokens"):
        mode = "mean"
    elif config.get("pooling_mode_cls_token"):
        mode = "cls"
    else:
        raise UserError(f"{where}: pooling neither mean nor CLS; infinity pools only those")
    bert = gate.read_json(model_dir / "sentence_bert_config.json", gate.DOCUMENT, fix, True)
    longest = (bert or {}).get("max_seq_length")
    return mode, longest if isinstance(longest, int) and longest > 0 else None


def cache_key(model_dir: Path) -> str:
    """What the export is made from, as the GGUF cache keys it: the config, and each
    tokenizer and weight file's name, size and modification time."""
    digest = hashlib.sha256(f"zenvllm-onnx-{EXPORT_VERSION}".encode())
    digest.update(gate.read_bytes(model_dir / "config.json", gate.DOCUMENT, "") or b"")
    for path in sorted([*model_dir.glob("tokenizer*.json"), *model_dir.glob("*.safetensors")]):
        st = path.stat()
        digest.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def cached_onnx(model_dir: Path, image: str, pooling: str, cache: Path, uid: int) -> Path:
    """The model's ONNX directory for infinity under `cache`, exported once by `image`
    (as user `uid`) and reused; the model's own directory is never written."""
    out = cache / "onnx" / f"{model_dir.name}-{cache_key(model_dir)}"
    if (out / DONE).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    os.chown(work, uid, uid)
    argv = ["run", "--rm", "--network", "none", "--user", f"{uid}:{uid}"]
    argv += ["-v", f"{model_dir}:{SOURCE}:ro", "-v", f"{work}:{MOUNT}", "-w", "/tmp"]
    argv += ["--entrypoint", "python", image, "-c", EXPORT, pooling]
    done = DOCKER.run(*argv, timeout=1800)
    if done.returncode != 0 or not (work / DONE).is_file():
        shutil.rmtree(work, ignore_errors=True)
        tail = (done.stdout + done.stderr).strip()[-1500:]
        raise RuntimeError(f"ONNX export of {model_dir.name} in {image} failed:\n{tail}")
    work.rename(out)
    remove_stale(out, model_dir.name)
    return out


def remove_stale(out: Path, name: str) -> None:
    """Exports of older weights of the same model are never read again."""
    mine = re.compile(rf"{re.escape(name)}-[0-9a-f]{{16}}")
    for stale in out.parent.iterdir():
        if stale != out and mine.fullmatch(stale.name) and (stale / DONE).is_file():
            shutil.rmtree(stale)
