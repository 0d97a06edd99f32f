"""A model directory's files: the manifest every host's copy is checked against, and
what a delivery must do to a directory to make it match.

A manifest names each file (safetensors, config, tokenizer) by its path in the model
directory, with its size and SHA-256:

    {"zenvllm_model_manifest": 1,
     "files": {"config.json": {"size": 677, "sha256": "9f0c..."}, ...}}

A directory zenvllm writes holds a marker, `.zenvllm-model`: the files it verified
there, and those it was about to write when a transfer started. That content is the
proof of ownership: a file may be replaced only if it still holds what zenvllm verified
or was being written by zenvllm; anything else was changed by someone else and is
refused. A directory without the marker is the operator's: used as it is when every
file matches the manifest, never written to otherwise.

Pure: the runtime (runtime/modelsync.py) hashes the files and moves the bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from zenvllm.core import gate
from zenvllm.core.gate import InputError

FORMAT = 1
MARKER = ".zenvllm-model"  # the record of what zenvllm verified and is writing
PARTIAL = ".zenvllm-partial"  # cut transfers wait here to be resumed (rsync's too)
MAX_FILES = 100_000  # a 405 B model has 191 shards; a manifest of more is not a model
MAX_SIZE = 1 << 50  # 1 PiB per file
SHA256 = re.compile(r"[0-9a-f]{64}")
MANIFEST_FIX = "make the manifest with `zenvllm model manifest DIR` from a copy you trust"
SHOWN = 5  # differences named in a refusal; the count says how many more


@dataclass(frozen=True)
class Entry:
    size: int
    sha256: str


Files = dict[str, Entry]  # relative POSIX path -> what the file must hold


def check_path(path: str, where: str, fix: str) -> str:
    """A relative path inside the model directory, in its one normal spelling."""
    parts = path.split("/")
    bad = (
        not path
        or len(path) > 4096
        or "\\" in path
        or "\0" in path
        or any(p in ("", ".", "..") or len(p.encode()) > 255 for p in parts)
        or parts[0] == MARKER
        or PARTIAL in parts
    )
    if bad:
        raise InputError(
            f"{where}: {gate.shown(path)} is not a relative path inside the model directory "
            f"(no '..', no empty or absolute parts, not {MARKER} or {PARTIAL}); {fix}"
        )
    return path


def parse_files(value: Any, where: str, fix: str) -> Files:
    files = gate.obj(value, where, fix)
    if len(files) > MAX_FILES:
        raise InputError(f"{where} lists {len(files):,} files, over {MAX_FILES:,}; {fix}")
    out = {}
    for path, raw in sorted(files.items()):
        at = f"{where}.{check_path(path, where, fix)}"
        entry = gate.obj(raw, at, fix)
        digest = gate.text(entry.get("sha256"), f"{at}.sha256", fix)
        if not SHA256.fullmatch(digest):
            raise InputError(f"{at}.sha256 is {gate.shown(digest)}, not 64 hex digits; {fix}")
        size = gate.whole(entry.get("size"), f"{at}.size", 0, MAX_SIZE, fix)
        out[path] = Entry(size, digest)
    return out


def parse_manifest(text: str, source: str) -> Files:
    data = gate.obj(gate.parse_json(text, source, MANIFEST_FIX), source, MANIFEST_FIX)
    version = data.get("zenvllm_model_manifest")
    if version != FORMAT:
        raise InputError(
            f"{source}: zenvllm_model_manifest is {gate.shown(version)}, not {FORMAT}; "
            f"{MANIFEST_FIX}"
        )
    files = parse_files(data.get("files"), f"{source}: files", MANIFEST_FIX)
    if not files:
        raise InputError(
            f"{source}: files is empty, a model has at least config.json; {MANIFEST_FIX}"
        )
    return files


def as_json(files: Files) -> dict[str, Any]:
    return {p: {"size": e.size, "sha256": e.sha256} for p, e in sorted(files.items())}


def manifest_text(files: Files) -> str:
    return json.dumps({"zenvllm_model_manifest": FORMAT, "files": as_json(files)}, indent=1) + "\n"


@dataclass(frozen=True)
class Marker:
    verified: Files  # what zenvllm last verified in the directory
    writing: Files  # what a transfer it started was writing (empty when none is)

    def recorded(self) -> set[str]:
        return set(self.verified) | set(self.writing)


def parse_marker(text: str, source: str) -> Marker | None:
    """The marker's record; None when the file is not zenvllm's marker at all."""
    fix = f"zenvllm wrote no such {MARKER}: move the directory away or choose another"
    data = gate.parse_json(text, source, fix)
    if not isinstance(data, dict) or data.get("zenvllm_model") != FORMAT:
        return None
    return Marker(
        parse_files(data.get("verified"), f"{source}: verified", fix),
        parse_files(data.get("writing"), f"{source}: writing", fix),
    )


def marker_text(marker: Marker) -> str:
    record = {
        "zenvllm_model": FORMAT,
        "verified": as_json(marker.verified),
        "writing": as_json(marker.writing),
    }
    return json.dumps(record, indent=1) + "\n"


@dataclass(frozen=True)
class Found:
    """What the directory holds: whether it exists, every file in it (but the marker and
    partial transfers), the files of interest hashed, and zenvllm's marker."""

    exists: bool
    paths: frozenset[str]
    hashed: Files
    marker: Marker | None


@dataclass(frozen=True)
class Steps:
    """What a delivery does: nothing (verified), or claim the directory, remove
    zenvllm's own stale files and transfer these."""

    verified: bool
    transfer: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    claim: bool = False  # write the marker before any byte of the model
    foreign: bool = False  # the operator's directory, used as it is
    extra: tuple[str, ...] = ()  # files not in the manifest, left alone


def differences(wanted: Files, hashed: Files, paths: list[str]) -> str:
    def why(path: str) -> str:
        have = hashed.get(path)
        if have is None:
            return f"{path} missing"
        if have.size != wanted[path].size:
            return f"{path} holds {have.size:,} bytes, not {wanted[path].size:,}"
        return f"{path} differs (sha256 {have.sha256[:12]}..., not {wanted[path].sha256[:12]}...)"

    shown = [why(p) for p in paths[:SHOWN]]
    more = f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else ""
    return "; ".join(shown) + more


def mismatched(wanted: Files, hashed: Files) -> list[str]:
    """The wanted files a directory lacks or holds otherwise, in order."""
    return sorted(p for p in wanted if hashed.get(p) != wanted[p])


def ours(marker: Marker, path: str, held: Entry) -> bool:
    """Whether a file holds what zenvllm verified or was writing there."""
    return held in (marker.verified.get(path), marker.writing.get(path))


def decide(directory: str, wanted: Files, found: Found) -> Steps:
    """The steps that make `directory` hold `wanted`, or InputError when that would
    overwrite something zenvllm did not write."""
    wrong = mismatched(wanted, found.hashed)
    marker = found.marker
    recorded = marker.recorded() if marker else set()
    extra = tuple(sorted(found.paths - set(wanted) - recorded))
    if marker is None:
        if not found.paths:  # missing or empty: zenvllm's from now on
            return Steps(verified=False, transfer=tuple(sorted(wanted)), claim=True)
        if not wrong:
            return Steps(verified=True, foreign=True, extra=extra)
        raise InputError(
            f"{directory} holds files zenvllm did not write ({MARKER} is missing) and they "
            f"differ from the manifest: {differences(wanted, found.hashed, wrong)}. zenvllm "
            "never overwrites them: move the directory away, or choose another "
            "zenvllm_model_dir (a directory that is missing or empty is zenvllm's to fill)"
        )
    # A file being written when a transfer was cut is zenvllm's whatever it holds.
    changed = [
        p
        for p in wrong
        if p in found.hashed and p not in marker.writing and not ours(marker, p, found.hashed[p])
    ]
    if changed:
        raise InputError(
            f"{directory}: files changed since zenvllm verified them: "
            f"{differences(wanted, found.hashed, changed)}. zenvllm never overwrites a "
            "change it did not make: restore or remove those files, then run again"
        )
    stale = tuple(
        sorted(
            p
            for p in recorded - set(wanted)
            if p in found.hashed and ours(marker, p, found.hashed[p])
        )
    )
    if not wrong and not stale:
        return Steps(verified=True, extra=extra)
    return Steps(verified=False, transfer=tuple(wrong), remove=stale, claim=True, extra=extra)


def claimed(marker: Marker | None, wanted: Files, removed: tuple[str, ...]) -> Marker:
    """The marker written before a transfer: what is verified stays, minus what goes."""
    verified = {p: e for p, e in (marker.verified if marker else {}).items() if p not in removed}
    return Marker(verified, dict(wanted))
