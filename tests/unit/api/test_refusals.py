"""A refusal always lingers (its answer written, the connection half-closed, the client's
unread request drained), the oldest lingering socket closed to make room."""

from __future__ import annotations

import asyncio

from app.api.refusals import MAX_LINGERING, Lingering, linger


class Transport(asyncio.Transport):
    """What `linger` writes to: the answer, the half-close, and the close."""

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
    lingering = Lingering()
    transports = [Transport() for _ in range(MAX_LINGERING + 3)]
    for transport in transports:
        linger(transport, b"HTTP/1.1 503 Service Unavailable\r\n\r\n", lingering, loop)
    # Every client got its answer and a half-close (no reset for an unread request).
    assert all(t.written.startswith(b"HTTP/1.1 503") and t.eof for t in transports)
    assert len(lingering) == MAX_LINGERING
    assert [t.closed for t in transports[:3]] == [True, True, True]  # the oldest three
    assert not any(t.closed for t in transports[3:])
    for transport in transports:
        transport.close()
    assert len(lingering) == 0
