"""A refusal of the connection layer (408, 431, 503) as the client reads it: a whole
HTTP/1.1 response outside the parser (`raw_response`), written, the connection
half-closed and what the client still sends read and dropped for up to `LINGER_S`
(`linger`): closing with its request unread would send a TCP reset that destroys the
answer before the client reads it. At most `MAX_LINGERING` linger; a new refusal closes
the oldest, whose answer left first."""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus

from app.errors import GatewayError

LINGER_S = 2.0  # a refused connection's unread request is read and dropped this long
MAX_LINGERING = 256  # beyond this many lingering sockets, the oldest is closed


class Lingering:
    """One server's lingering sockets, oldest first."""

    def __init__(self) -> None:
        self.sockets: dict[_Linger, asyncio.Transport] = {}

    def __len__(self) -> int:
        return len(self.sockets)


class _Linger(asyncio.Protocol):
    """A refused connection after its answer: reads and drops what the client still sends
    until it closes or `LINGER_S` passes."""

    def __init__(
        self, lingering: Lingering, transport: asyncio.Transport, timer: asyncio.TimerHandle
    ) -> None:
        self.lingering, self.timer = lingering, timer
        lingering.sockets[self] = transport

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool | None:
        return None  # the client read the answer and closed: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()
        self.lingering.sockets.pop(self, None)


def linger(
    transport: asyncio.Transport,
    answer: bytes | None,
    lingering: Lingering,
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Write `answer`, half-close, and drop the client's unread bytes for a bounded time:
    a close with bytes unread sends a reset, which can destroy the answer unread. With
    `MAX_LINGERING` lingering, the oldest is closed to make room (its answer left first)."""
    if answer is not None:
        transport.write(answer)
    if not transport.can_write_eof():
        transport.close()
        return
    while len(lingering.sockets) >= MAX_LINGERING:
        oldest = next(iter(lingering.sockets))
        lingering.sockets.pop(oldest).close()
    timer = loop.call_later(LINGER_S, transport.close)
    transport.set_protocol(_Linger(lingering, transport, timer))
    transport.write_eof()
    transport.resume_reading()


def raw_response(err: GatewayError) -> bytes:
    """A whole HTTP/1.1 response carrying `err`'s envelope, closing the connection."""
    body = json.dumps(err.body()).encode()
    phrase = HTTPStatus(err.status).phrase
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        **err.headers,
        "connection": "close",
    }
    head = f"HTTP/1.1 {err.status} {phrase}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()
    )
    return head.encode("latin-1") + b"\r\n" + body
