"""`python3 -m zenvllm.runtime files write [--dry-run]`: the files a role rendered on the
controller, written on the host in one process, each only if it differs.

stdin is JSON, {"files": [{"path": P, "content": TEXT, "mode": "0644"}, ...]}; stdout
says which were (or, with --dry-run, would be) written: {"changed": bool, "paths": [...]}.
The instances role rendered each instance's environment file and unit, and the status
service and timer, with a template module apiece (a stat and a copy or file module each:
4 module runs per instance and 4 for the status units on a re-run that changes nothing).
Whose a path is was settled before (the preflight refuses a file zenvllm did not write);
each is replaced in one rename, owned by the user who runs this (root, as the role
does), so a reader never sees half of one. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from zenvllm.core import gate
from zenvllm.core.errors import UserError
from zenvllm.runtime.atomic import write_atomically

FIX = "the role renders this input; run the role again, or report it"
# An instance's files are a few KiB each; a host's whole set stays far below this.
FILES_CAP = 4 * gate.MIB


@dataclass(frozen=True)
class Wanted:
    path: Path
    content: bytes
    mode: int


def wanted(doc: object) -> list[Wanted]:
    """The files of stdin's document, each an absolute path, its text and an octal mode."""
    files = gate.items(gate.obj(doc, "stdin", FIX).get("files"), "files", FIX)
    out = []
    for n, entry in enumerate(files):
        where = f"files[{n}]"
        f = gate.obj(entry, where, FIX)
        path = Path(gate.text(f.get("path"), f"{where}.path", FIX))
        if not path.is_absolute():
            raise UserError(f"{where}.path {path} is not absolute; {FIX}")
        mode = gate.text(f.get("mode"), f"{where}.mode", FIX)
        if not (len(mode) == 4 and set(mode) <= set("01234567")):
            raise UserError(f"{where}.mode {mode!r} is not four octal digits such as 0644; {FIX}")
        text = gate.text(f.get("content"), f"{where}.content", FIX)
        out.append(Wanted(path, text.encode(), int(mode, 8)))
    return out


def differs(file: Wanted) -> bool:
    """Whether the host's file is missing, or not this content, mode and owner."""
    try:
        st = file.path.lstat()
    except FileNotFoundError:
        return True
    if (st.st_mode & 0o7777, st.st_uid, st.st_gid) != (file.mode, os.geteuid(), os.getegid()):
        return True
    if not stat.S_ISREG(st.st_mode) or st.st_size != len(file.content):
        return True  # another size: no need to read it (and no more than its own is read)
    return gate.read_bytes(file.path, len(file.content), FIX, optional=True) != file.content


def write(files: list[Wanted], dry_run: bool) -> list[str]:
    """Each file that differs, replaced whole: the paths written (or that would be)."""
    changed = [f for f in files if differs(f)]
    if dry_run:
        return [str(f.path) for f in changed]
    # Every directory first: a set refused is refused before any of it is written.
    for f in changed:
        if not f.path.parent.is_dir():
            raise UserError(
                f"{f.path.parent} is not a directory, so {f.path} cannot go there; {FIX}"
            )
    for f in changed:
        write_atomically(f.path, f.content, f.mode)
    return [str(f.path) for f in changed]


def report(paths: list[str]) -> int:
    """What a step that writes on the host did (or would do), for the role's changed_when;
    compile-cache prepare says it so too."""
    print(json.dumps({"changed": bool(paths), "paths": paths}))
    return 0


def run_write(args: argparse.Namespace) -> int:
    text = gate.read_stream(sys.stdin.buffer, FILES_CAP, "the files on stdin", FIX)
    return report(write(wanted(gate.parse_json(text, "the files on stdin", FIX)), args.dry_run))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("files", help="write files a role rendered, each only if it differs")
    verbs = p.add_subparsers(dest="action", required=True)
    w = verbs.add_parser("write", help="write stdin's files that differ on this host")
    w.add_argument("--dry-run", action="store_true", help="say which; write nothing (check mode)")
    w.set_defaults(func=run_write)
