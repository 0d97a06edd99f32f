"""The nspawn test networks' bridges: a link of a bridge's name is removed only when a
test run left it (a bridge holding only the network's own address), never another one."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import require, require_tool
from support import nspawn

NET = nspawn.Network("zvnsbrt", "10.231.99")


def shown(kind: str, *inet: tuple[str, int]) -> list[dict]:
    """`ip -j -d addr show dev zvnsbrt` as iproute2 prints it."""
    addresses = [{"family": "inet", "local": a, "prefixlen": n} for a, n in inet]
    addresses.append({"family": "inet6", "local": "fe80::1", "prefixlen": 64})
    return [{"ifname": NET.bridge, "linkinfo": {"info_kind": kind}, "addr_info": addresses}]


def test_only_a_veth_on_a_test_bridge_or_none_is_a_killed_machines():
    veth = {"ifname": "vb-fleet-a", "linkinfo": {"info_kind": "veth"}}
    assert nspawn.veth_left_by_a_test([veth])  # its bridge gone with the run
    assert nspawn.veth_left_by_a_test([veth | {"master": nspawn.ROUTED_FLEET.bridge}])
    assert not nspawn.veth_left_by_a_test([veth | {"master": "br-operator"}])
    assert not nspawn.veth_left_by_a_test([veth | {"linkinfo": {"info_kind": "bridge"}}])
    assert not nspawn.veth_left_by_a_test([{"ifname": "vb-fleet-a"}])  # a plain link
    assert not nspawn.veth_left_by_a_test([])


def test_only_a_bridge_holding_only_the_networks_address_is_a_tests():
    assert nspawn.left_by_a_test(shown("bridge", ("10.231.99.1", 24)), NET)
    assert not nspawn.left_by_a_test(shown("bridge"), NET)  # no address: not as we leave it
    assert not nspawn.left_by_a_test(shown("bridge", ("10.231.99.1", 16)), NET)
    assert not nspawn.left_by_a_test(shown("bridge", ("10.231.99.1", 24), ("192.0.2.1", 24)), NET)
    assert not nspawn.left_by_a_test(shown("veth", ("10.231.99.1", 24)), NET)
    assert not nspawn.left_by_a_test([], NET)


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True)


def test_a_bridge_of_the_name_that_is_not_a_tests_is_refused_untouched():
    require_tool("ip")
    require(os.geteuid() == 0, "a bridge needs root")
    ip("link", "add", NET.bridge, "type", "bridge")
    try:
        ip("addr", "add", "192.0.2.1/24", "dev", NET.bridge)  # someone else's address
        with pytest.raises(RuntimeError, match="zvnsbrt exists and is not a bridge"):
            nspawn.bridge_up(NET)
        after = json.loads(ip("-j", "addr", "show", "dev", NET.bridge).stdout)
        assert [a["local"] for a in after[0]["addr_info"] if a["family"] == "inet"] == ["192.0.2.1"]
        ip("addr", "flush", "dev", NET.bridge)
        ip("addr", "add", "10.231.99.1/24", "dev", NET.bridge)  # as a killed run leaves it
        nspawn.bridge_up(NET)  # replaced
        assert "10.231.99.1" in ip("-j", "addr", "show", "dev", NET.bridge).stdout
    finally:
        subprocess.run(["ip", "link", "del", NET.bridge], capture_output=True)


def test_a_veth_of_a_machines_name_on_another_bridge_is_refused_untouched():
    """A veth left under a test machine's name is removed only off every bridge but the
    tests': on an operator's bridge it stays, and the boot is refused naming it."""
    require_tool("ip")
    require(os.geteuid() == 0, "a veth needs root")
    theirs, name = "zvoperator", "zvtest"
    ip("link", "add", theirs, "type", "bridge")
    try:
        ip("link", "add", f"vb-{name}", "type", "veth", "peer", "name", "zvtest-peer")
        ip("link", "set", f"vb-{name}", "master", theirs)
        with pytest.raises(RuntimeError, match=f"vb-{name} exists and is not a veth"):
            nspawn.wait_veth_gone(name, timeout=0)
        assert (
            json.loads(ip("-j", "link", "show", "dev", f"vb-{name}").stdout)[0]["master"] == theirs
        )
        ip("link", "set", f"vb-{name}", "nomaster")  # as a killed run leaves it, its bridge gone
        nspawn.wait_veth_gone(name, timeout=0)
        assert subprocess.run(["ip", "link", "show", f"vb-{name}"], capture_output=True).returncode
    finally:
        subprocess.run(["ip", "link", "del", f"vb-{name}"], capture_output=True)
        subprocess.run(["ip", "link", "del", theirs], capture_output=True)
