"""The launcher refuses a port something already listens on, before vLLM loads a model."""

from __future__ import annotations

import socket

import pytest

from zenvllm.core.errors import UserError
from zenvllm.runtime import launcher


@pytest.fixture
def listener():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_listening_port_is_taken(listener):
    assert launcher.port_taken("127.0.0.1", listener)
    assert launcher.port_taken("0.0.0.0", listener)  # all addresses include loopback


def test_a_closed_port_is_free():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert not launcher.port_taken("127.0.0.1", port)


def test_check_port_names_the_port_and_the_fix(listener):
    command = ["vllm", "serve", "/m", "--host", "127.0.0.1", "--port", str(listener)]
    with pytest.raises(
        UserError, match=rf"port {listener} on 127.0.0.1 is already in use.*--port N"
    ):
        launcher.check_port(command)
