"""A pipeline group's members leave it when it breaks, so their supervisors restart it.

vLLM 0.32 hardly notices a lost host: measured with two stage containers, a killed
worker left the head answering /health with 200; the next request hung until vLLM's
RPC timeout (300 s, "RPC call to sample_tokens timed out") ended the head, and without
a request nothing would have. Each member of a group started with `--nnodes` holds TCP
connections to the head's torch.distributed store (the head's `--master-port`) for its
whole life, so the launcher forks this watch before it execs vLLM: a connection on that
port established for `PATIENCE` checks is a member's, and its loss for `PATIENCE` checks
means a member is gone, so the watch ends this container's vLLM.
The supervisor (systemd, or the engine's restart policy) starts it again; a head waits
for its workers and a worker retries its head, so the group forms again by itself.
Standard library only: it runs in the image before vLLM.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from zenvllm.core import gate

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
TABLE_CAP = 64 << 20  # 64 MiB: some 400,000 connections
ESTABLISHED = "01"  # the kernel's state code in /proc/net/tcp
EVERY = 2.0  # seconds between checks
PATIENCE = 3  # checks a connection must last to be a member's, or stay gone to break the group


def store_connections(tables: Iterable[str], port: int) -> frozenset[str]:
    """The established TCP connections with either end on `port` ("local remote" in the
    kernel's hex), from /proc/net/tcp texts."""
    found = set()
    for text in tables:
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != ESTABLISHED:
                continue
            ends = (fields[1], fields[2])
            if any(end.rsplit(":", 1)[-1] == f"{port:04X}" for end in ends):
                found.add(" ".join(ends))
    return frozenset(found)


@dataclass
class Watch:
    """The group's state from successive sets of connections: a connection seen in
    `patience` checks in a row is a member's (a short-lived one never is); the group broke
    when a member's has been gone for `patience` checks. Each connection counts on its
    own, not the whole set: a member killed seconds after the group formed (a warm start
    forms it in seconds) is still missed, and a restarted member's new connection (to
    the old head's store, too) never stands in for the one it lost."""

    patience: int = PATIENCE
    members: frozenset[str] = frozenset()
    seen: dict[str, int] = field(default_factory=dict)  # connection: checks in a row
    gone: int = 0

    def broken(self, now: frozenset[str]) -> bool:
        self.seen = {c: self.seen.get(c, 0) + 1 for c in now}
        self.members |= {c for c, checks in self.seen.items() if checks >= self.patience}
        self.gone = self.gone + 1 if self.members - now else 0
        return self.gone >= self.patience


def read_tables() -> list[str] | None:
    """The kernel's TCP tables; None when one cannot be read whole (no verdict then)."""
    try:
        return [gate.read_text(Path(path), TABLE_CAP, "", optional=True) or "" for path in TABLES]
    except gate.InputError:
        return None


def end_vllm() -> None:
    """Kill vLLM's processes but PID 1 (a container's PID 1 ignores SIGKILL), then ask
    PID 1, the API server, to stop: with its engine gone it exits."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)  # every process we may signal but PID 1 and this one
    os.kill(1, signal.SIGTERM)


def watch(
    port: int,
    read: Callable[[], list[str] | None] = read_tables,
    sleep: Callable[[float], None] = time.sleep,
    every: float = EVERY,
) -> None:
    state = Watch()
    while True:
        tables = read()
        if tables is not None and state.broken(store_connections(tables, port)):
            break
        sleep(every)
    print(
        f"zenvllm-launch: the pipeline group broke: {len(state.members - set(state.seen))} of "
        f"its {len(state.members)} connection(s) on its store port {port} closed; ending "
        "this member so its supervisor restarts it and the group forms again",
        file=sys.stderr,
        flush=True,
    )


SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def interface_of(address: str) -> str | None:
    """The network interface holding this IPv4 address, or None. torch's gloo picks the
    address the hostname resolves to, and Debian's and cloud-init's /etc/hosts map it to
    127.0.1.1, which no other host reaches: the launcher names the interface instead
    (GLOO_SOCKET_IFNAME), the one the host's planned address is on."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(reply[20:24]) == address:
                return name
    return None


def start(port: int) -> None:
    """Fork the watch; the parent goes on to exec vLLM."""
    if os.fork() == 0:
        try:
            watch(port)
            end_vllm()
        finally:
            os._exit(0)
