"""Put a model on this host and prove it: hash a directory against a manifest, claim a
directory before writing into it, fetch files from a mirror with resumable ranges.

The rules (who may write what) are core/modelfiles.py's; this module does the I/O.
A cut download waits in `.zenvllm-partial/` and the next run asks the mirror only for
the rest (an HTTP Range request); a file takes its place only once its SHA-256 matches,
so vLLM never sees half a shard. rsync's `--partial-dir` uses the same directory, so
both sources resume alike.

The mirror is a plain directory served over HTTP(S) (nginx, a bucket) or the Hugging
Face layout that HF_ENDPOINT mirrors serve: the URL is then
`<endpoint>/<org>/<model>/resolve/<revision>`, and HF_TOKEN, when set, is sent as a
bearer token.
"""

from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from zenvllm import __version__
from zenvllm.core import gate, modelfiles
from zenvllm.core.errors import UserError
from zenvllm.core.gate import MIB, InputError
from zenvllm.core.modelfiles import MARKER, PARTIAL, Entry, Files, Found, Marker, Steps
from zenvllm.runtime.atomic import write_atomically

TIMEOUT = 60  # seconds without a byte before a transfer counts as cut


class TransferError(UserError):
    """A download that stopped short or brought the wrong bytes (exit 2, run again)."""


def listing(directory: Path) -> tuple[frozenset[str], Marker | None]:
    """Every file under `directory` (symlinks to files too) but the partial transfers,
    and zenvllm's marker, which is then not listed; a marker zenvllm did not write
    counts as the operator's file."""
    found = set()
    for top, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d != PARTIAL]
        rel = Path(top).relative_to(directory)
        found |= {(rel / name).as_posix() for name in files}
    marker = read_marker(directory) if MARKER in found else None
    if marker is not None:
        found.discard(MARKER)
    return frozenset(found), marker


def read_marker(directory: Path) -> Marker | None:
    path = directory / MARKER
    text = gate.read_text(path, gate.DOCUMENT, "", optional=True)
    return None if text is None else modelfiles.parse_marker(text, str(path))


def hashed(directory: Path, paths: set[str]) -> Files:
    out = {}
    for rel in sorted(paths):
        path = directory / rel
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            continue
        out[rel] = Entry(size, gate.digest(path))
    return out


def scan(directory: Path, wanted: Files) -> Found:
    if not directory.exists():
        return Found(False, frozenset(), {}, None)
    if not directory.is_dir():
        raise InputError(f"{directory} is not a directory; give zenvllm_model_dir a directory")
    paths, marker = listing(directory)
    recorded = marker.recorded() if marker else set()
    return Found(True, paths, hashed(directory, (set(wanted) | recorded) & paths), marker)


def inside(directory: Path, rel: str) -> Path:
    """`directory/rel`, refused when a symlinked directory on the way leads elsewhere."""
    path = directory / rel
    parent = path.parent.resolve()
    if parent != directory.resolve() and directory.resolve() not in parent.parents:
        raise InputError(
            f"{path}: a directory on the way is a symlink out of {directory}; zenvllm writes "
            "only inside the model directory: remove the symlink"
        )
    return path


def prepare(directory: Path, wanted: Files, dry_run: bool = False) -> Steps:
    """Decide, then (unless a dry run) claim the directory and remove zenvllm's own
    stale files, so a transfer may write into it."""
    found = scan(directory, wanted)
    steps = modelfiles.decide(str(directory), wanted, found)
    if dry_run or not steps.claim:
        return steps
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    write_atomically(
        directory / MARKER,
        modelfiles.marker_text(modelfiles.claimed(found.marker, wanted, steps.remove)),
    )
    for rel in steps.remove:
        inside(directory, rel).unlink()
    return steps


def verify(directory: Path, wanted: Files) -> Files:
    """Hash every wanted file; record them as verified in zenvllm's marker (an operator's
    directory gets nothing written). InputError names the files that differ."""
    found = scan(directory, wanted)
    if wrong := modelfiles.mismatched(wanted, found.hashed):
        raise InputError(
            f"{directory}: {modelfiles.differences(wanted, found.hashed, wrong)}; the source "
            "does not hold the manifest's files: fix the source or the manifest, then run again"
        )
    if found.marker is not None and found.marker != Marker(wanted, {}):
        record_verified(directory, wanted)
    return wanted


def record_verified(directory: Path, wanted: Files) -> None:
    write_atomically(directory / MARKER, modelfiles.marker_text(Marker(wanted, {})))


# ---------------------------------------------------------------- HTTP(S) mirror


def file_url(base: str, rel: str) -> str:
    return f"{base.rstrip('/')}/{urllib.parse.quote(rel)}"


def check_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(
            f"{gate.shown(url)} is not an http(s) URL; give zenvllm_model_url as "
            "https://mirror/models/NAME or <HF_ENDPOINT>/<org>/<model>/resolve/<revision>"
        )
    return url


def start_at(part: Path, entry: Entry) -> int:
    """Bytes of a cut transfer worth keeping: none when the partial file is longer than
    the file, or complete but wrong (it then restarts from the first byte)."""
    try:
        have = os.stat(part).st_size
    except FileNotFoundError:
        return 0
    if have > entry.size or (have == entry.size and gate.digest(part) != entry.sha256):
        part.unlink()
        return 0
    return have


def request(url: str, offset: int, token: str) -> urllib.request.Request:
    headers = {"User-Agent": f"zenvllm/{__version__}"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return urllib.request.Request(url, headers=headers)


def download(url: str, part: Path, entry: Entry, token: str) -> None:
    """Append the rest of the file to `part` (from its start if the mirror ignores the
    range), never more bytes than the manifest's size."""
    offset = start_at(part, entry)
    if offset == entry.size:
        return
    try:
        reply = urllib.request.urlopen(request(url, offset, token), timeout=TIMEOUT)
    except urllib.error.HTTPError as err:
        raise TransferError(
            f"{url}: the mirror answered {err.code} {err.reason}; check "
            "zenvllm_model_url and the mirror"
        ) from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TransferError(
            f"{url}: {reason}; check zenvllm_model_url and the network, "
            "then run again (the transfer resumes)"
        ) from None
    with reply:
        if offset and reply.status != 206:
            offset = 0  # the mirror sent the whole file: start over
        elif offset and not reply.headers.get("Content-Range", "").startswith(f"bytes {offset}-"):
            raise TransferError(
                f"{url}: asked for bytes {offset:,}- and the mirror answered "
                f"{reply.headers.get('Content-Range')!r}; use a mirror that "
                "serves byte ranges"
            )
        got = offset
        with open(part, "ab") as f:  # appends after what is kept
            f.truncate(offset)
            try:
                while chunk := reply.read(MIB):
                    got += len(chunk)
                    if got > entry.size:
                        raise TransferError(
                            f"{url}: the mirror sent more than the manifest's "
                            f"{entry.size:,} bytes; the mirror holds another file"
                        )
                    f.write(chunk)
            except OSError as err:  # a reset, a timeout
                reason = f"cut ({err})"
            else:
                reason = "cut"
            f.flush()
            os.fsync(f.fileno())
    if got < entry.size:
        raise TransferError(
            f"{url}: transfer {reason} at {got:,} of {entry.size:,} bytes; "
            "run again and it resumes from there"
        )


def fetch(
    directory: Path,
    wanted: Files,
    base_url: str,
    token: str = "",
    dry_run: bool = False,
    progress: Callable[[str], None] = lambda _: None,
) -> Steps:
    """Make `directory` hold `wanted` from the mirror at `base_url`, then verify it."""
    check_url(base_url)
    steps = prepare(directory, wanted, dry_run)
    if dry_run or steps.verified:
        return steps
    for rel in steps.transfer:
        target = inside(directory, rel)
        part = target.parent / PARTIAL / target.name  # where rsync's --partial-dir puts it
        part.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        url = file_url(base_url, rel)
        progress(f"{rel}: {url}")
        download(url, part, wanted[rel], token)
        if gate.digest(part) != wanted[rel].sha256:
            part.unlink()
            raise TransferError(
                f"{url}: the SHA-256 of the {wanted[rel].size:,} bytes received is not the "
                "manifest's; the mirror holds another file (the partial copy was removed)"
            )
        os.chmod(part, 0o644)
        os.replace(part, target)
        with contextlib.suppress(OSError):  # left when other cut files wait there
            part.parent.rmdir()
    # Each fetched file was hashed before its rename, the others by prepare: recorded
    # without reading the whole model a second time.
    record_verified(directory, wanted)
    return steps


def manifest_of(directory: Path) -> Files:
    """The manifest of a model directory as it is (from a copy you trust)."""
    if not (directory / "config.json").is_file():
        raise InputError(f"{directory} has no config.json; give a model directory")
    return hashed(directory, set(listing(directory)[0]))
