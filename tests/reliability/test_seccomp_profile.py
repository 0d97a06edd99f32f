"""The instances' seccomp profile is the engine's own default plus the five NUMA calls.

Compared by effect, not by text: for this machine's architecture and the
capability sets that matter (none, zenvllm's SYS_NICE alone, Docker's
default set, every capability), the shipped profile must treat every system
call exactly as the running engine's default profile does, except that it
allows get_mempolicy, set_mempolicy, mbind, migrate_pages and move_pages.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import pytest
import seccomp_policy as sp
from conftest import IN_CI, REPO, require

pytestmark = pytest.mark.reliability

SHIPPED = REPO / "ansible" / "roles" / "zenvllm_instances" / "files" / "seccomp-numa.json"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
KERNEL = tuple(int(p) for p in platform.release().split("-")[0].split(".")[:2])


def every_cap(*profiles: dict) -> frozenset[str]:
    return frozenset(
        cap
        for profile in profiles
        for rule in profile["syscalls"]
        for key in ("includes", "excludes")
        for cap in (rule.get(key) or {}).get("caps", [])
    )


def cap_sets(caps: frozenset[str]) -> dict[str, frozenset[str]]:
    """The capability sets to compare under: named ones, each alone, all but each."""
    sets = {
        "no capabilities": frozenset(),
        "zenvllm (SYS_NICE only)": frozenset({"CAP_SYS_NICE"}),
        "docker's defaults + SYS_NICE": sp.DOCKER_DEFAULT_CAPS | {"CAP_SYS_NICE"},
        "every capability": caps,
    }
    sets.update({f"{c} alone": frozenset({c}) for c in caps})
    sets.update({f"all but {c}": caps - {c} for c in caps})
    return sets


@pytest.fixture(scope="module")
def engine_default() -> dict:
    version = sp.engine_package_version()
    require(version is not None, "the engine is not Debian's docker.io (dpkg knows no docker.io)")
    cache = Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm"))
    try:
        return sp.engine_default_profile(cache, version)
    except Exception as err:
        if IN_CI:
            raise
        pytest.skip(f"cannot fetch docker.io {version}'s default seccomp profile: {err}")


def test_default_action_is_the_engines(engine_default):
    shipped = json.loads(SHIPPED.read_text())
    assert shipped["defaultAction"] == engine_default["defaultAction"] == "SCMP_ACT_ERRNO"
    assert sp.default_errno(shipped) == sp.default_errno(engine_default) == 1  # EPERM


def test_profile_is_engine_default_plus_numa_calls(engine_default):
    shipped = json.loads(SHIPPED.read_text())
    sets = cap_sets(every_cap(shipped, engine_default) | sp.DOCKER_DEFAULT_CAPS)
    for label, caps in sets.items():
        added, changed = sp.compare(shipped, engine_default, ARCH, caps, KERNEL)
        ours = sp.effective(shipped, ARCH, caps, KERNEL)
        theirs = sp.effective(engine_default, ARCH, caps, KERNEL)
        extra = {
            n: (sorted(ours.get(n, ())), sorted(theirs.get(n, ())))
            for n in (added | changed) - sp.NUMA_CALLS
        }
        # Only the NUMA calls may differ, and those are allowed without conditions.
        assert extra == {}, (label, extra)
        for name in sp.NUMA_CALLS:
            assert ours[name] == frozenset({("SCMP_ACT_ALLOW", None, "[]")}), (label, name)
    print(f"\nseccomp: same effect as the engine's default under {len(sets)} capability sets, "
          f"plus {', '.join(sorted(sp.NUMA_CALLS))}")  # fmt: skip
