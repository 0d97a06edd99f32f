"""A pipeline group's members leave it when it breaks, so their supervisors restart it.

vLLM 0.32 hardly notices a lost host: measured with two stage containers, a killed
worker left the head answering /health with 200; the next request hung until vLLM's
RPC timeout (300 s, "RPC call to sample_tokens timed out") ended the head, and without
a request nothing would have. Each member of a group started with `--nnodes` holds TCP
connections to the head's torch.distributed store (the head's `--master-port`) for its
whole life: a connection on that port established for `PATIENCE` checks is a member's,
and its loss for `PATIENCE` checks means a member is gone.

The launcher, the container's PID 1, runs vLLM as its child and watches (`supervise`):
vLLM's API server as PID 1 could not be killed from inside the container, and asked to
stop it waits for every open request, which on a dead engine ends only when its clients
give up (measured: 115 s of a 161 s heal, until the test's clients timed out). When the
group breaks the launcher kills vLLM at once and exits; the supervisor (systemd, or the
engine's restart policy) starts the container again; a head waits for its workers and a
worker retries its head, so the group forms again by itself.

A member that hangs (stopped, stuck) or whose packets are dropped without a reset keeps
its connections up. The head then notices by vLLM's own step timeout, which the plan
sets for groups (core/container.py, STAGE_STEP_TIMEOUT_S): its engine fails the step,
vLLM ends, and its connections close. A headless member cut off from its head would
never learn that (no packet reaches it): it also probes the head's /health and leaves
once a head that answered has not for `HEAD_GRACE` seconds.
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
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from zenvllm.core import gate

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
TABLE_CAP = 64 << 20  # 64 MiB: some 400,000 connections
ESTABLISHED = "01"  # the kernel's state code in /proc/net/tcp
EVERY = 2.0  # seconds between checks
PATIENCE = 3  # checks a connection must last to be a member's, or stay gone to break the group
# Seconds a headless member waits for its head's /health to answer again, once it has:
# a partition that drops packets sends no reset, so the store's connections stay up.
# Over a head's answer under load (milliseconds), under the time a restarted head takes
# to load its stage, so the member is back before the head waits for it.
HEAD_GRACE = 30.0
PROBE_TIMEOUT = 5.0  # seconds one /health probe of the head may take


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


@dataclass
class HeadWatch:
    """A headless member's view of its head: once the head of this member's group has
    answered /health, a head that has not answered for `grace` seconds means the group is
    gone. Answers count only once this member holds a connection to the head's store (it
    joined: before that, the group is still forming and its head answers nothing). A
    member restarted alone finds the old head's API server still answering for seconds
    after its engine died; taking those for its new group's, it left the new head while
    that was loading, and the group never formed (CI of stop 68)."""

    grace: float = HEAD_GRACE
    answered: float | None = None  # when the head of this member's group last answered

    def gone(self, answers: bool, now: float, joined: bool) -> bool:
        if answers and joined:
            self.answered = now
            return False
        return not answers and self.answered is not None and now - self.answered >= self.grace


def answers(url: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether `url` answers 200 within `timeout` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return bool(reply.status == 200)
    except (OSError, ValueError):
        return False


def read_tables() -> list[str] | None:
    """The kernel's TCP tables; None when one cannot be read whole (no verdict then)."""
    try:
        return [gate.read_text(Path(path), TABLE_CAP, "", optional=True) or "" for path in TABLES]
    except gate.InputError:
        return None


def watch(
    port: int,
    read: Callable[[], list[str] | None] = read_tables,
    sleep: Callable[[float], None] = time.sleep,
    every: float = EVERY,
    ended: Callable[[], bool] = lambda: False,
    head: Callable[[], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Check the group every `every` seconds: True once it broke (and why, on stderr),
    False once `ended()` says vLLM ended by itself. `head`, for a headless member: whether
    its head answers now."""
    state, head_watch = Watch(), HeadWatch()
    while not ended():
        tables = read()
        if tables is not None and state.broken(store_connections(tables, port)):
            broke(
                f"{len(state.members - set(state.seen))} of its {len(state.members)} "
                f"connection(s) on its store port {port} closed"
            )
            return True
        if head is not None and head_watch.gone(head(), clock(), joined=bool(state.members)):
            broke(f"its head has not answered /health for {head_watch.grace:.0f} s")
            return True
        sleep(every)
    return False


def broke(why: str) -> None:
    print(
        f"zenvllm-launch: the pipeline group broke: {why}; ending this member so its "
        "supervisor restarts it and the group forms again",
        file=sys.stderr,
        flush=True,
    )


# What an engine or systemd sends to stop or signal a container: vLLM's to handle.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def reap(child: int) -> int | None:
    """Reap every exited process, as PID 1 must (vLLM's orphans are re-parented to it):
    `child`'s exit code once it has exited, else None."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0  # nothing left to wait for: the child was reaped elsewhere
        if pid == 0:
            return None
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code  # killed by a signal: as a shell says


def supervise(
    command: list[str],
    env: dict[str, str],
    port: int,
    every: float = EVERY,
    head_url: str = "",
) -> int:
    """Run `command` (vLLM) as this process's child and watch its group (and, for a
    headless member, its head at `head_url`): vLLM's exit code when it ends by itself,
    1 when the group broke (vLLM killed at once)."""
    child = os.fork()
    if child == 0:
        try:
            os.setpgid(0, 0)  # vLLM and its processes in a group of their own, to kill
            os.execvpe(command[0], command, env)
        finally:
            os._exit(127)  # exec failed; the error is on stderr

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    exited: list[int] = []

    def ended() -> bool:
        code = reap(child)
        if code is not None:
            exited.append(code)
        return bool(exited)

    head = (lambda: answers(head_url)) if head_url else None
    if not watch(port, every=every, ended=ended, head=head):
        return exited[0]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child, signal.SIGKILL)  # what escaped the group dies with PID 1's exit
    while reap(child) is None:
        time.sleep(0.1)
    return 1


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
