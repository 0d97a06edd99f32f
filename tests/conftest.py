"""Shared test plumbing: tiers that need the outside world fail in CI, skip elsewhere."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "hosts"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Property tests explore new examples on a developer's machine (that is how they find
# bugs) but replay a fixed set in CI, so a run's verdict depends on the code alone.
settings.register_profile("ci", derandomize=True)
if IN_CI:
    settings.load_profile("ci")


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
