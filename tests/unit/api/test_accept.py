"""The listener's own accept loop: paused, newcomers wait connected in the kernel's
backlog and are taken up on resume; out of files, it backs off instead of spinning."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Any

import pytest

from app.api.accept import FULL_BACKOFF_S, Acceptor

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
