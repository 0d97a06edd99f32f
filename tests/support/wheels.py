"""Wheels for hosts without PyPI (the nspawn hosts): downloaded once, cached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def router_version() -> str:
    """vllm-router's pin, where the router role reads it (dockerfiles/build.yaml)."""
    build = yaml.safe_load((REPO / "dockerfiles" / "build.yaml").read_text())
    return str(build["fleet"]["vllm-router"]["version"])


def router_wheelhouse() -> Path:
    """vllm-router and what it needs, for CPython 3.11 on x86_64 (Debian 12's python3)."""
    version = router_version()
    cache = Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm"))
    dest = cache / "wheels" / f"vllm-router-{version}"
    done = dest / ".complete"
    if not done.exists():
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--only-binary=:all:",
                "--python-version",
                "3.11",
                "--platform",
                "manylinux_2_28_x86_64",
                "--platform",
                "manylinux2014_x86_64",
                "--platform",
                "manylinux_2_17_x86_64",
                "--dest",
                str(dest),
                f"vllm-router=={version}",
            ],
            check=True,
            timeout=600,
        )
        done.write_text(version + "\n")
    return dest
