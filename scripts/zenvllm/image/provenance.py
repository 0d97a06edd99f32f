"""Where an image comes from, as OCI labels: the project, the source revision and its date.

Deterministic on purpose: the same sources give the same labels, so a rebuild of an
unchanged tree is a layer-cache hit with the same image ID, and a commit that touches
nothing the image holds (tests, docs, the bench) changes nothing. Never the wall clock:
the revision is the last commit of the image's sources, its date that commit's, and
with no git checkout the package version with no date at all.

Everything here is pure except `last_commit` (one `git log`) and `origin` (reads the
environment), the edges the CLI calls.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from zenvllm import SHIPPED_LAYERS, __version__
from zenvllm.core.errors import UserError
from zenvllm.deploy import data

PROJECT_URL = "https://github.com/zenvllm/zenvllm"
LICENSE = "Apache-2.0"
OCI = "org.opencontainers.image"
# The reproducible-builds convention for "the time of this source", in seconds.
SOURCE_DATE_EPOCH = "SOURCE_DATE_EPOCH"


@dataclass(frozen=True)
class Commit:
    sha: str
    epoch: int  # committer date, seconds since 1970 (UTC)


def parse_log(text: str) -> Commit | None:
    """`git log -1 --format='%H %ct'` -> Commit; None for no commit (untracked paths)."""
    words = text.split()
    if len(words) != 2 or not (words[1].isascii() and words[1].isdigit()):
        return None
    return Commit(words[0], int(words[1]))


def source_date_epoch(value: str | None) -> int | None:
    """SOURCE_DATE_EPOCH, refused when malformed (the convention says fail, not guess)."""
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit()):
        raise UserError(
            f"{SOURCE_DATE_EPOCH}={value!r} is not a whole number of seconds since 1970; "
            f"unset it or set it to a commit's time, e.g. $(git log -1 --format=%ct)"
        )
    return int(value)


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def labels(
    commit: Commit | None, version: str, date_override: int | None, base_image: str
) -> dict[str, str]:
    """The OCI labels of an image built from these sources on top of `base_image`."""
    out = {
        f"{OCI}.source": PROJECT_URL,
        f"{OCI}.revision": commit.sha if commit else version,
        f"{OCI}.licenses": LICENSE,
        f"{OCI}.base.name": base_image,
    }
    when = date_override if date_override is not None else commit.epoch if commit else None
    if when is not None:  # no date rather than "now": now would make every build new
        out[f"{OCI}.created"] = rfc3339(when)
    return out


def image_sources(peer: bool = False) -> list[Path]:
    """What goes into an image: the templates and build.yaml, and for zenvllm's own
    targets the package files they copy (a bench peer holds no zenvllm code). Resolved,
    because in a checkout the package's dockerfiles/ is a link and git follows paths."""
    found = [data.DOCKERFILES]
    if not peer:
        found += [data.ROOT / "__init__.py", *(data.ROOT / layer for layer in SHIPPED_LAYERS)]
    return [p.resolve() for p in found]


def last_commit(paths: Sequence[Path]) -> Commit | None:
    """The last commit that touched any of `paths`; None outside a git checkout (an
    installed package), without git, or when git refuses the directory."""
    present = [p for p in paths if p.exists()]
    if not present:
        return None
    where = present[0] if present[0].is_dir() else present[0].parent
    argv = ["git", "-C", str(where), "log", "-1", "--format=%H %ct", "--", *map(str, present)]
    # GIT_DIR and friends (a caller's hook) would point git at another repository.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_log(done.stdout) if done.returncode == 0 else None


def origin(
    base_image: str, peer: bool = False, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The OCI labels of an image built now from this package's sources."""
    date = source_date_epoch(environ.get(SOURCE_DATE_EPOCH))
    return labels(last_commit(image_sources(peer)), __version__, date, base_image)
