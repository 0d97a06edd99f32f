"""Who may reach a copy cut over hosts: its own hosts, and those that need its API.

A pipeline group's processes listen beyond the API and the head's store port: gloo and
vLLM's message queues bind ephemeral ports that no setting of the images' torch (2.13)
or vLLM (0.32) pins, and their traffic is unauthenticated (the queues carry pickled
objects). So the instances role's firewall filters by who owns the socket, not by a
list of ports: every container of the deployment's group runs under one cgroup of its
own (`docker run --cgroup-parent`), and nftables' `socket cgroupv2` match drops a new
connection or a datagram to any socket of that cgroup from an address that is not a
peer. The rest of the host (the operator's
own services) is matched by nothing and passes as before.

nft resolves the cgroup's path under /sys/fs/cgroup when the table loads and compares
the socket's ancestor at an absolute depth. Inside a cgroup namespace (an nspawn or LXC
host) that depth is deeper than the path, and unknowable from inside, so the table has
one rule per depth up to MAX_LEVEL: only the true one can match. The cgroup must exist
when the table loads; the role makes it first (a slice started, or a directory made).
Pure; standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from zenvllm.core.errors import PlanError

DRIVERS = ("auto", "systemd", "cgroupfs")
# Where the cgroup v2 hierarchy is mounted under /sys/fs/cgroup: "" (a v2 host), "unified"
# (a hybrid v1 host), or "none" (v1 only: nftables cannot match by owner there).
MOUNTS = ("auto", "", "unified", "none")
MAX_LEVEL = 16  # the deepest cgroup nesting a host's containers are expected under
SLICE_ROOT = "zenvllm.slice"


@dataclass(frozen=True)
class GroupGuard:
    parent: str  # `docker run`'s --cgroup-parent
    slice: str  # the systemd slice the role starts ("" under cgroupfs': it makes cgroup_dir)
    cgroup_dir: str  # the group's cgroup, which must exist before the firewall loads
    nft_path: str  # the same, as nft's `socket cgroupv2` names it (under /sys/fs/cgroup)
    levels: tuple[int, ...]  # the depths it may sit at, one rule each


def slice_of(deployment: str) -> str:
    """The deployment's slice: systemd nests a slice under each '-' of its name, so any
    character but letters, digits and '_' becomes '_' (as the firewall table's name)."""
    return f"zenvllm-{re.sub(r'[^A-Za-z0-9_]', '_', deployment)}.slice"


def guard_of(deployment: str, mount: str, driver: str, supervisor: str) -> GroupGuard:
    """The group's cgroup, where cgroup v2 is mounted at `mount` and the engine names
    cgroups by `driver`: systemd's (a slice under zenvllm.slice) or cgroupfs' (the same
    path). Not read from a host (auto): a v2 host's, and systemd's driver where systemd
    supervises, as Docker chooses on cgroup v2."""
    mount = "" if mount == "auto" else mount
    if mount not in ("", "unified"):
        raise PlanError(
            "a copy cut over hosts is closed to all but its peers by nftables' socket "
            "cgroupv2 match, which needs the cgroup v2 hierarchy (at /sys/fs/cgroup, or "
            "/sys/fs/cgroup/unified beside v1); this host has none. Boot it with "
            "systemd.unified_cgroup_hierarchy=1 (Debian 12's default; the match needs "
            "Linux 5.13 or newer, Debian 12 has 6.1)"
        )
    if driver == "auto":
        driver = "systemd" if supervisor == "systemd" else "cgroupfs"
    name = slice_of(deployment)
    path = f"{SLICE_ROOT}/{name}"
    nft_path = f"{mount}/{path}" if mount else path
    return GroupGuard(
        parent=name if driver == "systemd" else f"/{path}",
        slice=name if driver == "systemd" else "",
        cgroup_dir=f"/sys/fs/cgroup/{nft_path}",
        nft_path=nft_path,
        levels=tuple(range(path.count("/") + 1, MAX_LEVEL + 1)),
    )
