"""What hosts and images receive of zenvllm: the core and runtime layers, standard
library only (zenvllm.SHIPPED_LAYERS), never the image or bench code.

Images copy these files; hosts get them as one zipapp (`zenvllm.pyz`), which the
Ansible collection carries in its instances role and runs with
`PYTHONPATH=zenvllm.pyz python3 -m zenvllm.runtime plan|model|...`. The zipapp is
byte-for-byte the same for the same sources (fixed order, times and modes), so a
re-run of the play copies nothing.

Each module is there as source and as bytecode of the Python that builds it (checked
hash-based .pyc, PEP 552, so the bytes follow the source alone): zipimport can write no
bytecode cache, so from source alone every run compiles what it imports (0.35 against
0.21 to 0.25 s of a Zen 3 core for `zenvllm.runtime --help`), and the hosts run it often
(the status timer, the play's steps). Where the magic number is another Python's, or
the source was edited after (its hash differs), zipimport reads the source.

    python -m zenvllm.deploy.shipped DEST.pyz
"""

from __future__ import annotations

import io
import marshal
import subprocess
import sys
import zipfile
from pathlib import Path

from zenvllm import SHIPPED_LAYERS, __version__
from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.deploy import data
from zenvllm.runtime.atomic import write_atomically

# The first lines of the file: ownership is proven by content (Ansible reads them
# before replacing a file at that path), then the archive itself.
MARK = "# zenvllm planner "
HEADER = (
    f"#!/usr/bin/env python3\n{MARK}{__version__}: zenvllm's core and runtime as one zipapp.\n"
).encode()
MAIN = b"from zenvllm.runtime import __main__  # noqa: F401\n"
OWN = "reinstall zenvllm: its own files are missing or damaged"
EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold


def files() -> dict[str, Path]:
    """Path inside the package tree (zenvllm/...) -> the file on disk."""
    root = data.ROOT
    found = [root / "__init__.py"]
    found += [p for layer in SHIPPED_LAYERS for p in sorted((root / layer).glob("*.py"))]
    return {f"zenvllm/{p.relative_to(root)}": p for p in found}


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def write_zipapp(dest: Path) -> Path:
    """Write the zipapp atomically; only over a file that is zenvllm's own."""
    dest = Path(dest)
    if (dest.exists() or dest.is_symlink()) and not is_ours(dest):
        raise UserError(
            f"{dest} exists and zenvllm did not write it (its second line is not "
            f"{MARK.strip()!r}); give the planner zipapp another path"
        )
    buffer = io.BytesIO()
    buffer.write(HEADER)  # Python finds the archive after it, as after a zipapp's shebang
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(_entry("__main__.py"), MAIN)
        sources = {name: gate.read_bytes(path, gate.SMALL, OWN) for name, path in files().items()}
        compiled = bytecode(sources)
        for name in sorted(sources):
            archive.writestr(_entry(name), sources[name])
            archive.writestr(_entry(name + "c"), compiled[name])
    write_atomically(dest, buffer.getvalue())
    return dest


# Compiled in a child of its own: marshal writes a string once interned in the process
# differently (seen: one constant of commands_status.py under pytest), so the same
# sources give the same bytes only from the same fresh interpreter state.
_COMPILE = """
import importlib.util, marshal, sys
sources = marshal.loads(sys.stdin.buffer.read())
flags = (0b11).to_bytes(4, "little")  # hash-based, checked against the source
sys.stdout.buffer.write(marshal.dumps({
    name: importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source)
    + marshal.dumps(compile(source, name, "exec", dont_inherit=True))
    for name, source in sources.items()
}))
"""


def bytecode(sources: dict[str, bytes]) -> dict[str, bytes]:
    """The .pyc zipimport reads before each source: this Python's magic number, the
    flags of a checked hash-based file, the source's hash, the marshalled code."""
    argv = [sys.executable, "-I", "-S", "-c", _COMPILE]
    done = subprocess.run(
        argv, input=marshal.dumps(sources), capture_output=True, env={"PYTHONHASHSEED": "0"}
    )
    if done.returncode != 0:
        raise UserError(f"compiling the zipapp's modules failed: {done.stderr.decode()[-2000:]}")
    compiled: dict[str, bytes] = marshal.loads(done.stdout)
    return compiled


def is_ours(path: Path) -> bool:
    """Its second line is the mark (a FIFO, a device or a file over 1 MiB is not)."""
    if path.is_symlink():
        return False
    try:
        head = gate.read_bytes(path, gate.SMALL, "").split(b"\n", 2)
    except gate.InputError:
        return False
    return len(head) > 2 and head[1].startswith(MARK.encode())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m zenvllm.deploy.shipped DEST.pyz", file=sys.stderr)
        return 2
    print(write_zipapp(Path(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
