"""Make the Debian base image locally: no registry is reachable, so no FROM can pull.

debootstrap writes a minbase rootfs once; its tarball is cached under
$ZENVLLM_CACHE/base/ and imported as a local tag (zenvllm/debian:bookworm).
Every step is skipped when its result already exists, so the second run costs
one `docker image inspect`.

    python -m zenvllm.image.baseimage [--tag T] [--suite S] [--mirror URL] [--engine E]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from zenvllm.core.errors import UserError
from zenvllm.runtime.engine import DOCKER_NAME, Cli

DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"  # plain HTTP: the TLS proxy leaves it alone


def default_tag(suite: str = DEFAULT_SUITE) -> str:
    return f"zenvllm/debian:{suite}"


def cache_dir() -> Path:
    return Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm"))


def tarball_path(suite: str, cache: Path) -> Path:
    return cache / "base" / f"debian-{suite}-minbase.tar"


def image_exists(engine: str, tag: str) -> bool:
    return Cli(engine).ok("image", "inspect", "--format", "{{.Id}}", tag)


def make_tarball(suite: str, mirror: str, dest: Path) -> None:
    """debootstrap into a temp dir, trim it, tar it; rename at the end (no half tarball)."""
    if shutil.which("debootstrap") is None:
        raise UserError(
            "debootstrap not found: install it (apt-get install debootstrap) "
            "or pass --base-image with an image you already have"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".rootfs-") as tmp:
        root = Path(tmp) / "root"
        subprocess.run(
            ["debootstrap", "--variant=minbase", suite, str(root), mirror],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # apt lists and downloaded .debs are a third of the size and stale at once.
        for junk in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for entry in (root / junk).glob("*"):
                if entry.is_file():
                    entry.unlink()
        part = Path(tmp) / "rootfs.tar"
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", str(part), "."], check=True
        )
        part.rename(dest)


def import_tarball(engine: str, tarball: Path, tag: str) -> None:
    with tarball.open("rb") as stream:
        Cli(engine).run("import", "-", tag, stdin=stream, timeout=None, check=True)


def ensure_base_image(
    tag: str | None = None,
    suite: str = DEFAULT_SUITE,
    mirror: str = DEFAULT_MIRROR,
    engine: str = DOCKER_NAME,
    cache: Path | None = None,
) -> str:
    """Return the tag of a local Debian base image, making it only if missing. One
    maker at a time (`make test` makes it beside a tier, which may ask for it too):
    the next waits, then finds it made."""
    tag = tag or default_tag(suite)
    if image_exists(engine, tag):
        return tag
    tarball = tarball_path(suite, cache or cache_dir())
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with (tarball.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_exists(engine, tag):
            return tag
        if not tarball.exists():
            print(f"base-image: debootstrap {suite} -> {tarball} (about 1 min)", file=sys.stderr)
            make_tarball(suite, mirror, tarball)
        print(f"base-image: importing {tarball} as {tag}", file=sys.stderr)
        import_tarball(engine, tarball, tag)
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zenvllm.image.baseimage", description=__doc__)
    parser.add_argument("--tag", default=None, help="local tag (default zenvllm/debian:SUITE)")
    parser.add_argument("--suite", default=DEFAULT_SUITE)
    parser.add_argument("--mirror", default=DEFAULT_MIRROR)
    parser.add_argument("--engine", default=DOCKER_NAME, help="docker or podman")
    args = parser.parse_args(argv)
    try:
        print(ensure_base_image(args.tag, args.suite, args.mirror, args.engine))
    except UserError as err:
        print(f"base-image: error: {err}", file=sys.stderr)
        return 2
    except (subprocess.CalledProcessError, RuntimeError) as err:
        print(f"base-image: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
