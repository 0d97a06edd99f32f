"""The instances role's nftables table as the role renders it: it closes zenvllm's own
ports to all but the hosts that need them, and nothing else of the host (a table that
dropped every packet not to an open TCP port took this machine's DNS replies while a
test deployment stood: pip could not resolve pypi.org)."""

from __future__ import annotations

import re
import subprocess

from conftest import require, require_tool
from support import role_template
from support.ansible_run import ANSIBLE_DIR

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


def rules(text: str) -> list[str]:
    chain = text.split("chain input {", 1)[1].split("}\n}", 1)[0]
    return [line.strip() for line in chain.splitlines() if line.strip()][1:]


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
