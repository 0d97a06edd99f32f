"""The instances role's nftables table as the role renders it: it closes zenvllm's own
ports to all but the hosts that need them, and nothing else of the host (a table that
dropped every packet not to an open TCP port took this machine's DNS replies while a
test deployment stood: pip could not resolve pypi.org)."""

from __future__ import annotations

import contextlib
import re
import subprocess
from dataclasses import asdict
from pathlib import Path

from conftest import require, require_tool
from support import role_template
from support.ansible_run import ANSIBLE_DIR

from zenvllm.core import group_guard

ROLE = ANSIBLE_DIR / "roles" / "zenvllm_instances"
PLAN = {
    "instances": [
        {"port": 8001, "container": {"group_port": 29500}},
        {"port": 8002, "container": {"group_port": 0}},
    ]
}


def table(**overrides) -> str:
    variables = {
        "zenvllm_instances_plan": PLAN,
        "zenvllm_instances_firewall_sources": ["10.0.0.2", "fd00::2"],
        "zenvllm_instances_pipeline_peers": ["10.0.0.3"],
    }
    return role_template.render(ROLE, "firewall.nft.j2", **(variables | overrides))


def rules(text: str, chain: str = "input") -> list[str]:
    body = text.split(f"chain {chain} {{", 1)[1].split("\n    }\n", 1)[0]
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    return lines[1:] if chain == "input" else lines


def test_only_zenvllms_ports_are_closed_and_only_to_strangers():
    found = rules(table())
    assert found == [
        'iif "lo" accept',
        "tcp dport { 8001, 8002 } ip saddr { 10.0.0.2, 10.0.0.3 } accept",
        "tcp dport { 8001, 8002 } ip6 saddr { fd00::2 } accept",
        "tcp dport { 29500 } ip saddr { 10.0.0.3 } accept",
        "tcp dport { 8001, 8002, 29500 } counter drop",
    ]
    # The one drop names its protocol and ports: UDP, ICMP and every other port pass.
    drops = [r for r in found if r.endswith("drop")]
    assert all(re.fullmatch(r"tcp dport \{ [\d, ]+ \} counter drop", r) for r in drops), drops


def test_nft_reads_the_table():
    """`nft --check` parses and validates the rendered table without applying it."""
    require_tool("nft")
    done = subprocess.run(
        ["nft", "--check", "-f", "-"], input=table(), text=True, capture_output=True
    )
    require("Operation not permitted" not in done.stderr, "nft --check needs CAP_NET_ADMIN")
    assert done.returncode == 0, done.stderr


def group_plan(mount: str) -> dict:
    """A pipeline's plan, and the guard present.yml picks from it for the template."""
    guard = asdict(group_guard.guard_of("zenvllm-test", mount, "cgroupfs", "engine"))
    return {
        "zenvllm_instances_plan": {
            "instances": [{"port": 8001, "container": {"group_port": 29500, "guard": guard}}]
        },
        "zenvllm_instances_group_guard": guard,
    }


def test_a_pipeline_groups_every_socket_is_closed_to_all_but_its_peers_by_owner():
    text = table(**group_plan(""))
    found = rules(text)
    # The port rules as before; then anyone else to a socket of the group's cgroup.
    assert found[-3:] == [
        "tcp dport { 8001, 29500 } counter drop",
        "ip saddr != { 10.0.0.2, 10.0.0.3 } jump group",
        "ip6 saddr != { fd00::2 } jump group",
    ]
    path = "zenvllm.slice/zenvllm-zenvllm_test.slice"
    assert rules(text, "group") == [
        "tcp flags & (syn | ack) != syn return",
        "udp sport 53 return",
        *(f'socket cgroupv2 level {level} "{path}" counter drop' for level in range(2, 17)),
    ]
    # No IPv6 peer: every IPv6 packet goes to the group's check.
    plain = table(**group_plan(""), zenvllm_instances_firewall_sources=["10.0.0.2"])
    assert rules(plain)[-1] == "meta nfproto ipv6 jump group"


def test_nft_reads_the_groups_table_with_its_cgroup_on_this_host(tmp_path):
    """nft resolves the cgroup's path when it reads the table: it must exist (the role makes
    it first), under this host's cgroup v2 mount (a hybrid host's "unified")."""
    require_tool("nft")
    mount = "" if Path("/sys/fs/cgroup/cgroup.controllers").is_file() else "unified"
    guard = group_guard.guard_of("zenvllm-test", mount, "cgroupfs", "engine")
    text = table(**group_plan(mount))
    missing = subprocess.run(
        ["nft", "--check", "-f", "-"], input=text, text=True, capture_output=True
    )
    require("Operation not permitted" not in missing.stderr, "nft --check needs CAP_NET_ADMIN")
    assert missing.returncode != 0 and "cgroupv2 path fails" in missing.stderr
    made = Path(guard.cgroup_dir)
    made.mkdir(parents=True)
    try:
        done = subprocess.run(
            ["nft", "--check", "-f", "-"], input=text, text=True, capture_output=True
        )
        assert done.returncode == 0, done.stderr
    finally:
        made.rmdir()
        with contextlib.suppress(OSError):  # zenvllm.slice, unless a deployment's is in it
            made.parent.rmdir()
