"""Shared test plumbing: tiers that need the outside world fail in CI, skip elsewhere."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "hosts"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, reason: str) -> None:
    """Skip a test whose prerequisite is missing, except in CI where that is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing in CI (tiers may not skip): {reason}")
    pytest.skip(reason)


def require_tool(name: str) -> str:
    path = shutil.which(name)
    require(path is not None, f"{name} not found on PATH")
    return path  # type: ignore[return-value]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES
