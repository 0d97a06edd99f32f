"""A port scan as a stranger on a test network would run it, of the sockets that a
cgroup's processes listen on, found from the kernel's socket tables (not from a list).

`LISTENERS` runs on a host (over ssh, or here) and prints the TCP and UDP sockets
listening off loopback whose owner runs in a cgroup whose path holds a given name.
`stranger(bridge, address)` is a network namespace with its own address on the bridge:
its packets reach the hosts over the wire as a third host's do (an address of this
machine itself would come in on loopback). `probe` tries each socket from it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
from collections.abc import Callable, Iterator

# Run as `python3 -c LISTENERS NAME`: [[proto, address, port], ...] as JSON.
LISTENERS = r"""
import json, os, socket, struct, sys
name = sys.argv[1]
def address(hexed):
    raw = bytes.fromhex(hexed)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = struct.unpack("<4I", raw)
    return socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))
sockets = {}
for proto, state in (("tcp", "0A"), ("tcp6", "0A"), ("udp", "07"), ("udp6", "07")):
    with open(f"/proc/net/{proto}") as table:
        for line in list(table)[1:]:
            f = line.split()
            if f[3] != state:
                continue
            ip, port = f[1].rsplit(":", 1)
            sockets[f[9]] = (proto.rstrip("6"), address(ip), int(port, 16))
found = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cgroup") as cg:
            if name not in cg.read():
                continue
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inode = link[8:-1]
                if inode in sockets:
                    found.add(sockets[inode])
    except OSError:
        continue
print(json.dumps(sorted(s for s in found if not (s[1].startswith("127.") or s[1] == "::1"))))
"""

# Run in the stranger's namespace as `python3 -c PROBE JSON`: each [proto, host, port]
# with what became of it: open (TCP accepted), refused, or silent (dropped, or UDP).
PROBE = r"""
import json, socket, sys
out = []
for proto, host, port in json.loads(sys.argv[1]):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if proto == "udp":
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.settimeout(2)
            s.sendto(b"zenvllm scan", (host, port))
            try:
                s.recv(64)
                out.append("answered")
            except socket.timeout:
                out.append("silent")
            except OSError:
                out.append("refused")
        continue
    try:
        socket.create_connection((host, port), timeout=3).close()
        out.append("open")
    except ConnectionRefusedError:
        out.append("refused")
    except OSError:
        out.append("silent")
print(json.dumps(out))
"""


def listeners(
    run: Callable[[list[str]], str], cgroup_name: str, address: str
) -> list[tuple[str, str, int]]:
    """The sockets listening off loopback of processes under `cgroup_name`, on the host
    `run` runs an argv on (returning its stdout), at `address` on the host for those
    bound to every address (0.0.0.0, ::)."""
    found = json.loads(run(["python3", "-c", LISTENERS, cgroup_name]))
    return [(p, address if a in ("0.0.0.0", "::") else a, port) for p, a, port in found]


@contextlib.contextmanager
def stranger(bridge: str, address: str) -> Iterator[Callable[[list[tuple]], list[str]]]:
    """A namespace at `address` on `bridge` (the bridge's prefix length); yields `probe`:
    what became of each (proto, host, port) tried from there."""
    cidr = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "dev", bridge], capture_output=True, text=True
    ).stdout.split()[3]
    prefix = ipaddress.ip_interface(cidr).network.prefixlen
    ns, veth = "zvtest-stranger", "zvstranger0"
    setup = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
        ["ip", "link", "set", veth, "master", bridge, "up"],
        ["ip", "-n", ns, "addr", "add", f"{address}/{prefix}", "dev", "eth0"],
        ["ip", "-n", ns, "link", "set", "eth0", "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
    ]
    try:
        for argv in setup:
            subprocess.run(argv, check=True, capture_output=True, text=True)

        def probe(targets: list[tuple]) -> list[str]:
            done = subprocess.run(
                ["ip", "netns", "exec", ns, "python3", "-c", PROBE, json.dumps(targets)],
                capture_output=True,
                text=True,
                timeout=30 + 5 * len(targets),
                check=True,
            )
            return json.loads(done.stdout)

        yield probe
    finally:
        subprocess.run(["ip", "link", "del", veth], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
