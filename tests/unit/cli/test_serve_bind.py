"""`serve`'s listening address, bound before the app starts (`app.cli.serve.bind_sockets`):
a port another process listens on is refused with EADDRINUSE and nothing left open."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest

from app.cli.serve import bind_sockets


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 another server listens on (as a first gateway does)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_free_port_is_bound_not_yet_listening_and_not_inherited() -> None:
    (sock,) = bind_sockets("127.0.0.1", 0)
    with sock:
        host, port = sock.getsockname()
        assert (host, sock.family, sock.type) == ("127.0.0.1", socket.AF_INET, socket.SOCK_STREAM)
        assert port > 0
        assert not sock.get_inheritable()  # the backends the gateway starts do not hold it
        with socket.socket() as client:  # bound, not listening: connections are refused
            assert client.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED


def test_a_port_another_server_listens_on_is_refused(taken_port: int) -> None:
    with pytest.raises(OSError, match="in use") as refused:
        bind_sockets("127.0.0.1", taken_port)
    assert refused.value.errno == errno.EADDRINUSE


def test_a_port_in_time_wait_is_bound_again() -> None:
    """SO_REUSEADDR: a gateway restarted at once gets its port back."""
    (first,) = bind_sockets("127.0.0.1", 0)
    port = first.getsockname()[1]
    first.listen()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        accepted, _ = first.accept()
        accepted.close()  # the server side closes first: its end waits in TIME_WAIT
        client.recv(1)
    first.close()
    (again,) = bind_sockets("127.0.0.1", port)
    again.close()
