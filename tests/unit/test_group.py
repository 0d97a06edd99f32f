"""A pipeline group's watch (runtime/group.py): it counts the established connections on
the head's store port in the kernel's tables, and calls the group broken only when a
count that held steady falls and stays down."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from zenvllm.runtime import group
from zenvllm.runtime.launcher import check_port, group_port, head_health, listen_record

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"


def row(local: str, remote: str, state: str) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000  1000\n"


# The head of a measured group (store port 29501 = 0x733D): its own client, a worker's
# connection, a listener and a gloo pair on another port.
HEAD = HEADER + "".join(
    [
        row("0200A8C0:733D", "0200A8C0:85BE", "01"),  # the head's own store client
        row("0200A8C0:85BE", "0200A8C0:733D", "01"),  # ... its other end
        row("0200A8C0:733D", "0300A8C0:A312", "01"),  # the worker's
        row("00000000:733D", "00000000:0000", "0A"),  # listening: not a connection
        row("0200A8C0:83C3", "0300A8C0:B26C", "01"),  # gloo: another port
    ]
)


WORKER = "0200A8C0:733D 0300A8C0:A312"  # the worker's connection, as the set names it


def test_connections_on_the_store_port_are_found_from_either_end():
    assert len(group.store_connections([HEAD], 29501)) == 3
    assert WORKER in group.store_connections([HEAD], 29501)
    assert group.store_connections([HEAD], 29502) == frozenset()
    closing = HEAD.replace("0300A8C0:A312 01", "0300A8C0:A312 08")  # CLOSE_WAIT
    assert WORKER not in group.store_connections([closing, HEADER], 29501)


def sets(*names: str) -> list[frozenset[str]]:
    return [frozenset(n.split()) for n in names]


def test_a_group_breaks_only_when_a_member_of_its_steady_set_stays_gone():
    watch = group.Watch(patience=3)
    # Forming: connections come; a short-lived one never becomes a member.
    assert not any(
        watch.broken(s) for s in sets("", "a", "a b", "a b", "a b x", "a b", "a b", "a b")
    )
    assert watch.members == frozenset({"a", "b"})
    # Gone once is not a break; gone three checks is, even while a restarted member's
    # new connection ("c") makes the count whole again.
    assert [watch.broken(s) for s in sets("a", "a b", "a c", "a c", "a c")] == [
        False,
        False,
        False,
        False,
        True,
    ]


def test_members_form_while_other_connections_come_and_go():
    """Each connection counts on its own: short-lived ones beside the members (a set that
    never holds steady) neither delay the members nor join them, so a member lost right
    after a warm start formed the group is missed in `patience` checks."""
    watch = group.Watch(patience=3)
    assert not any(watch.broken(s) for s in sets("a b", "a b x", "a b y"))
    assert watch.members == frozenset({"a", "b"})
    assert [watch.broken(s) for s in sets("a z", "a c", "a c")] == [False, False, True]


def test_a_member_that_never_formed_is_never_broken():
    watch = group.Watch(patience=3)
    assert not any(watch.broken(frozenset()) for _ in range(20))


def test_the_watch_returns_when_the_group_breaks_and_says_why(capsys):
    worker_gone = HEAD.replace("0300A8C0:A312 01", "0300A8C0:A312 08")
    tables = iter([[HEAD]] * 4 + [[worker_gone]] * 3)
    naps: list[float] = []
    group.watch(29501, read=lambda: next(tables), sleep=naps.append, every=5)
    assert naps == [5] * 6
    assert "1 of its 3 connection(s) on its store port 29501 closed" in capsys.readouterr().err


def test_a_headless_member_leaves_once_a_head_that_answered_stays_silent():
    watch = group.HeadWatch(grace=30)
    # Restarted alone: the old head's API server answers for seconds after its engine
    # died, before this member joined any group; then the new head loads for longer
    # than the grace. Neither is a lost head.
    assert not any(watch.gone(True, t, joined=False) for t in range(0, 6, 2))
    assert not any(watch.gone(False, t, joined=False) for t in range(6, 300, 2))
    # Joined (a connection to the head's store): forming still, however long it takes.
    assert not any(watch.gone(False, t, joined=True) for t in range(300, 600, 2))
    assert not watch.gone(True, 600, joined=True)
    assert not watch.gone(False, 629, joined=True)  # a slow answer or two is not a lost head
    assert not watch.gone(True, 630, joined=True)
    assert not watch.gone(False, 659, joined=True)
    assert watch.gone(False, 660, joined=True)


def test_the_watch_leaves_a_group_whose_head_went_silent_and_says_why(capsys):
    answers = iter([True] * 3 + [False] * 20)
    clock = iter(range(0, 1000, 5))
    naps: list[float] = []
    broke = group.watch(
        29501,
        read=lambda: [HEAD],
        sleep=naps.append,
        every=5,
        head=lambda: next(answers),
        clock=lambda: next(clock),
    )
    assert broke and len(naps) == 8  # answered at 10 s, silent from 15 to 40 s
    assert "its head has not answered /health for 30 s" in capsys.readouterr().err


def test_the_watch_keeps_a_member_that_has_not_joined_whatever_the_old_head_said():
    """No store connection yet: the old head's answers and its silence after them are
    not this member's group's; the watch goes on until vLLM ends."""
    answers = iter([True] * 3 + [False] * 30)
    checks = iter(range(34))
    assert not group.watch(
        29501,
        read=lambda: [""],
        sleep=lambda _: None,
        every=5,
        ended=lambda: next(checks) == 33,
        head=lambda: next(answers),
        clock=iter(range(0, 1000, 5)).__next__,
    )


def test_a_probe_of_a_head_that_is_not_there_says_no_in_time():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/health"
        start = time.monotonic()
        assert not group.answers(url, timeout=0.5)
        assert time.monotonic() - start < 3
    assert not group.answers("http://127.0.0.1:1/health")  # refused


def serve(*args: str) -> list[str]:
    return ["vllm", "serve", "/model", "--host=10.0.0.12", "--port=8001", *args]


def test_the_launcher_knows_a_groups_members():
    group_args = ("--nnodes=2", "--master-addr=10.0.0.11", "--master-port=29500")
    head = serve(*group_args, "--node-rank=0")
    worker = serve(*group_args, "--node-rank=1", "--headless")
    assert group_port(head) == group_port(worker) == 29500
    assert group_port(serve()) is None and group_port(serve("--nnodes=1")) is None
    # The worker serves no API: its health is its head's, and its port is not its own.
    assert listen_record(head) == "10.0.0.12 8001"
    assert listen_record(worker) == "10.0.0.11 8001"
    assert head_health(worker) == "http://10.0.0.11:8001/health" and head_health(head) == ""
    check_port(worker)  # the head may hold 8001 on this very host: not a conflict


def test_an_unreadable_table_gives_no_verdict():
    worker_gone = HEAD.replace("0300A8C0:A312 01", "0300A8C0:A312 08")
    tables = iter([[HEAD]] * 3 + [None] * 5 + [[worker_gone]] * 3)
    naps: list[float] = []
    group.watch(29501, read=lambda: next(tables), sleep=naps.append, every=5)
    assert len(naps) == 10  # the five unread checks neither formed nor broke anything


def test_the_interface_of_an_address_is_found_on_this_machine():
    assert group.interface_of("127.0.0.1") == "lo"  # every Linux host has it
    assert group.interface_of("203.0.113.254") is None  # TEST-NET-3: on no host


SUPERVISE = "import os, sys; from zenvllm.runtime import group; "


def supervisor(command: list[str], port: int) -> subprocess.Popen[str]:
    """`group.supervise` in a process of its own (it forwards signals, reaps, kills a
    process group), checking every 0.1 s."""
    code = SUPERVISE + f"sys.exit(group.supervise({command!r}, dict(os.environ), {port}, 0.1))"
    return subprocess.Popen([sys.executable, "-c", code], text=True, stderr=subprocess.PIPE)


def test_the_supervisor_exits_as_vllm_does_and_forwards_a_stop():
    done = supervisor(["sh", "-c", "exit 3"], port=1)
    assert done.wait(10) == 3
    killed = supervisor(["sh", "-c", "kill -9 $$"], port=1)
    assert killed.wait(10) == 128 + 9  # as a shell reports a death by signal
    trapped = supervisor(["sh", "-c", "trap 'exit 7' TERM; sleep 30 & wait"], port=1)
    time.sleep(1)  # its trap set
    trapped.send_signal(signal.SIGTERM)
    assert trapped.wait(10) == 7


def test_the_supervisor_kills_vllm_at_once_when_its_group_breaks():
    """A real connection on a real port: a member's once it lasted 3 checks, its loss
    for 3 checks breaks the group, and vLLM (here a `sleep` that would outlive the
    test, with a child of its own) is killed with its process group."""
    with socket.create_server(("127.0.0.1", 0)) as store:
        port = store.getsockname()[1]
        member = socket.create_connection(("127.0.0.1", port))
        accepted, _ = store.accept()
        start = time.monotonic()
        proc = supervisor(["sh", "-c", "sleep 61.25 & sleep 61.5"], port)
        time.sleep(1.5)  # 15 checks: a member
        member.close()
        accepted.close()
        assert proc.wait(10) == 1
        assert time.monotonic() - start < 10
        # Loopback: both ends of the one connection are on the port.
        assert "the pipeline group broke: 2 of its 2 connection(s)" in proc.stderr.read()
        left = subprocess.run(["pgrep", "-f", "sleep 61[.](25|5)"], capture_output=True, text=True)
        assert left.stdout == "", left.stdout
