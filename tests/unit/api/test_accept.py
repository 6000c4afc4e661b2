"""The listener's own accept loop: paused, newcomers wait connected in the kernel's
backlog and are taken up on resume; out of files, it backs off instead of spinning; and
a refusal always lingers, the oldest lingering socket closed to make room."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Any

import pytest

from app.api.accept import FULL_BACKOFF_S, Acceptor
from app.api.connections import MAX_LINGERING, Slots, _linger

HOST = "127.0.0.1"


class Greeter(asyncio.Protocol):
    """Says hello and closes: a client that reads b"hello" was accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(b"hello")
        transport.close()


def listening(cls: type[socket.socket] = socket.socket) -> socket.socket:
    sock = cls(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    return sock


async def test_paused_newcomers_wait_in_the_backlog_until_resumed() -> None:
    loop = asyncio.get_running_loop()
    sock = listening()
    port = sock.getsockname()[1]
    acceptor = Acceptor([sock], Greeter, backlog=16, loop=loop)
    acceptor.start()
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
        assert await asyncio.wait_for(reader.read(), 5) == b"hello"
        writer.close()
        acceptor.pause()
        reader, writer = await asyncio.open_connection(HOST, port)  # the kernel completes it
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(), 0.3)
        acceptor.resume()
        assert await asyncio.wait_for(reader.read(), 5) == b"hello"
        writer.close()
    finally:
        await acceptor.close()
    assert sock.fileno() == -1  # the acceptor owns and closes its sockets


class OutOfFiles(socket.socket):
    def accept(self) -> tuple[socket.socket, Any]:
        raise OSError(errno.EMFILE, "Too many open files")


async def test_out_of_files_backs_off_instead_of_spinning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    sock = listening(OutOfFiles)
    acceptor = Acceptor([sock], Greeter, backlog=16, loop=loop)
    acceptor.start()
    caplog.set_level(logging.ERROR, logger="app.api.accept")
    try:
        _, writer = await asyncio.open_connection(HOST, sock.getsockname()[1])
        # The pending connection keeps the socket readable: a loop that did not stop
        # watching it would log on every turn.
        await asyncio.sleep(FULL_BACKOFF_S / 3)
        errors = [r for r in caplog.records if "cannot accept connections" in r.getMessage()]
        assert len(errors) == 1
        assert "Too many open files" in errors[0].getMessage()
        writer.close()
    finally:
        await acceptor.close()


class Transport(asyncio.Transport):
    """What `_linger` writes to: the answer, the half-close, and the close."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.eof = self.closed = False
        self.protocol: asyncio.BaseProtocol | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed and self.protocol is not None:
            self.closed = True
            self.protocol.connection_lost(None)


async def test_a_refusal_lingers_even_when_many_do_and_the_oldest_closes() -> None:
    loop = asyncio.get_running_loop()
    slots = Slots(cap=1)
    transports = [Transport() for _ in range(MAX_LINGERING + 3)]
    for transport in transports:
        _linger(transport, b"HTTP/1.1 503 Service Unavailable\r\n\r\n", slots, loop)
    # Every client got its answer and a half-close (no reset for an unread request).
    assert all(t.written.startswith(b"HTTP/1.1 503") and t.eof for t in transports)
    assert len(slots.lingering) == MAX_LINGERING
    assert [t.closed for t in transports[:3]] == [True, True, True]  # the oldest three
    assert not any(t.closed for t in transports[3:])
    for transport in transports:
        transport.close()
    assert slots.lingering == {}
