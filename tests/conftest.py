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


# The tiers that run in several workers: the Makefile runs them with pytest-xdist, `-n N
# --dist loadgroup`, and each module runs whole in the worker WORKERS names (a module not
# listed joins the first). Balanced by the modules' minutes, side by side.
#
# ansible, in three workers. Its modules' minutes (2026-11-25, a 2-core Zen 4, warm,
# serially): the routed fleet 27.2, the end-to-end deployment 14.0, the nspawn hosts 14.8,
# the cloud VMs 1.9, the renders and lint 3.7, the tensor-parallel one 1.4 (quick starts 2
# and 3, the tutorial and the release upgrade came later, 3 to 5 minutes each). So the
# routed fleet has a worker, with the renders and lint; the modules that use this
# machine's nginx share another (tests/unit/test_workers.py); the nspawn hosts, the quick
# starts and the cloud VMs take the third. The modules that
# boot machines each have a network of their own (support/nspawn.NETWORKS), so any two
# run side by side. On a fresh 2-core Zen 4 the tier took 44.4 minutes in two workers
# (b72cca8, busy 42.0 and 44.3) and 41.0 in three (48a929b, busy 39.1, 40.9 and 40.0),
# both cores 99.96% busy: the tier is bound by CPU there, so a fourth would add no CPU.
#
# serve (2026-11-26, the same VM, warm): the machine idled 45% of the tier run serially
# (vmstat; vLLM's start-up is mostly one thread). Its servers have names and ports of
# their own (the pipeline stages' fixed ones live in one module).
#
# image: the builds (test_build) and the CPU kinds in one worker, the registry, the package
# and the renders in the other; a build both ask for is one (BuildKit merges the same
# steps in flight, and keeps them for the later asks).
FIRST, SECOND, THIRD = "worker-1", "worker-2", "worker-3"
NAMES = (FIRST, SECOND, THIRD)
WORKERS = {
    "ansible": {
        "test_routed_fleet": FIRST,
        "test_openstack_inventory": FIRST,
        # Renders and lint beside the fleet, whose worker ended minutes before the other
        # two on a fresh Zen 3 (busy 48.3 against 54.8 and 53.6 min, 2026-12-07).
        "test_flavors": FIRST,
        "test_foreign_paths": FIRST,
        "test_lint": FIRST,
        # This machine's own nginx serves these three: one worker, or one's stop of it
        # (as found, or at its end) cuts another's gateway (CI, 2026-11-29).
        "test_e2e": SECOND,
        "test_tensor_parallel": SECOND,
        "test_tutorial": SECOND,
        "test_nspawn": THIRD,
        "test_quick_start": THIRD,
        "test_cloud_vms": THIRD,
    },
    "serve": {
        "test_serve": FIRST,
        "test_quantized": FIRST,
        # The encoder and the cross-encoder beside the first: with them on the second, the
        # Zen 3's workers were busy 8.1 and 11.7 min (2026-12-08).
        "test_embeddings": FIRST,
        "test_model_parallel": SECOND,
        "test_docs_serve": SECOND,
    },
    "image": {
        "test_build": FIRST,
        # After the builds it asks for too: on the second, a warm Zen 3's workers were
        # busy 2.1 and 4.8 min (2026-12-08), and fresh ones 11.5 and 13.3 (2026-12-07).
        "test_cpu_kinds": FIRST,
        "test_registry": SECOND,
        "test_package": SECOND,
        "test_render": SECOND,
    },
}


# Cases that leave their module's worker, by a part of their node ID, where one worker
# would end minutes after the other (its busy time, printed at the end of the tier): the
# serve tier's pace server (test_serve's third image) beside the model-parallel tests;
# the pace image's build and tests beside the package and registry tests, while the
# legacy builder's and podman's builds run on the first worker.
MOVED = {
    "serve": {("test_serve", "[pace]"): SECOND},
    "image": {("test_build", "::test_pace"): SECOND},
}


@pytest.hookimpl(tryfirst=True)  # before xdist's own reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = WORKERS.get(item.path.parent.name)
        if tier is None:
            continue
        worker = tier.get(item.path.stem, FIRST)
        for (module, part), elsewhere in MOVED.get(item.path.parent.name, {}).items():
            if item.path.stem == module and part in item.nodeid:
                worker = elsewhere
        item.add_marker(pytest.mark.xdist_group(worker))


def pytest_terminal_summary(terminalreporter) -> None:
    """Each worker's busy time (its tests' setup, call and teardown): the longest is
    the tier's, so WORKERS is balanced from these."""
    busy: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            worker = getattr(report, "nodeid", "").rpartition("@")[2]
            if worker in NAMES and hasattr(report, "duration"):
                busy[worker] = busy.get(worker, 0.0) + report.duration
    if busy:
        shown = ", ".join(f"{w} {s / 60:.1f} min" for w, s in sorted(busy.items()))
        terminalreporter.write_line(f"busy per worker: {shown}")


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
