"""The several-worker tiers' placement (tests/conftest.py WORKERS): modules that start and
stop this machine's own nginx run in one worker, so none stops it under another's
deployment. Once, in CI, the tutorial's stop cut the tensor-parallel module's gateway."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import FIRST, WORKERS

TESTS = Path(__file__).resolve().parents[1]
# How a module says it starts and stops this machine's nginx (support/gateway.py's
# context, or the init script itself); nspawn hosts' nginx is reached over ssh instead.
HOST_NGINX = ("nginx_as_found", "/etc/init.d/nginx")


def host_nginx_modules(tier: str) -> list[str]:
    return sorted(
        path.stem
        for path in (TESTS / tier).glob("test_*.py")
        if any(mark in path.read_text() for mark in HOST_NGINX)
    )


def test_the_modules_that_use_this_machines_nginx_share_a_worker():
    for tier, placed in WORKERS.items():
        modules = host_nginx_modules(tier)
        workers = {module: placed.get(module, FIRST) for module in modules}
        assert len(set(workers.values())) <= 1, f"{tier}: {workers}"


def test_the_scan_finds_the_ansible_tiers_users_of_this_machines_nginx():
    # The check above can fail only if the scan finds them.
    assert {"test_e2e", "test_tensor_parallel", "test_tutorial"} <= set(
        host_nginx_modules("ansible")
    )


def test_each_tier_runs_as_many_workers_as_its_placement_names():
    # One more worker than groups would idle; one fewer would run two groups in turn.
    makefile = (TESTS.parent / "Makefile").read_text()
    for tier, placed in WORKERS.items():
        recipe = re.search(rf"\$\(PYTEST\) -q -n (\d+) --dist loadgroup .*tests/{tier}\b", makefile)
        assert recipe, f"make test-{tier} runs no loadgroup workers"
        assert int(recipe[1]) == len(set(placed.values()) | {FIRST}), tier
