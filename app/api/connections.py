"""The gateway's HTTP/1.1 connections: uvicorn's httptools protocol (its fastest) plus
what it lacks against slow and abusive clients (`ServerConfig` says why each limit and
default).

- A request head (request line and headers) must arrive within `header_timeout_s` of the
  connection opening, or of its first byte on a kept-alive connection: uvicorn has no
  header timeout, and a client dribbling one byte at a time (slowloris) would hold its
  connection forever. Partial head: 408 then close; nothing yet: just close.
- A head over `max_header_bytes` is answered 431 and closed (httptools alone has no
  limit). The head is measured from the first byte after the previous request's body to
  the blank line that ends it.
- At most `max_connections` open: a new connection closes the one idle longest (no request
  in flight) to make room; when every one has a request in flight, the newcomer gets 503.

Only the connection layer lives here; the body's size and time are
`app.api.middleware.BodyGuard`'s. (h11's implementation bounds a head by itself, but costs
about a quarter of the gateway's throughput: measured with `bench/overhead.py`.)
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.errors import GatewayError, RequestHeadersTooLarge, RequestTimeout, TooManyConnections
from app.settings.root import ServerConfig

_HEAD_END = b"\r\n\r\n"


class GatewayProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` with a header timeout, a head size limit and a connection cap."""

    limits: ClassVar[ServerConfig] = ServerConfig()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_since = 0.0
        self.head_timer: asyncio.TimerHandle | None = None
        # Bytes of the request head read so far; None once its headers are complete.
        self.head_bytes: int | None = 0
        self._head_tail = b""  # the last bytes read of a head (its end may straddle reads)

    @classmethod
    def configured(cls, limits: ServerConfig) -> type[GatewayProtocol]:
        """The protocol class to give uvicorn (`http=`) for these limits."""
        return type("ConfiguredGatewayProtocol", (cls,), {"limits": limits})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.idle_since = self.loop.time()
        self._arm_head_timer()
        if len(self.connections) > self.limits.max_connections and not self._evict_one():
            self.connections.discard(self)
            self._refuse(
                TooManyConnections(
                    f"The gateway has {self.limits.max_connections} connections open, each "
                    "with a request in flight; retry shortly (see "
                    "MICROSCHEDULER_SERVER__MAX_CONNECTIONS).",
                )
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.head_bytes is not None:
            if self.head_timer is None:  # the first byte of the next request on a kept-alive one
                self._arm_head_timer()
            if self._head_too_large(data):
                limit = self.limits.max_header_bytes
                self._refuse(
                    RequestHeadersTooLarge(
                        f"The request line and headers are larger than this gateway accepts "
                        f"({limit} bytes; see MICROSCHEDULER_SERVER__MAX_HEADER_BYTES)."
                    )
                )
                return
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self.head_bytes = None
        self._head_tail = b""
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.head_bytes = 0  # what comes next is the next request's head

    def on_response_complete(self) -> None:
        self.idle_since = self.loop.time()
        super().on_response_complete()

    def _head_too_large(self, data: bytes) -> bool:
        assert self.head_bytes is not None
        limit = self.limits.max_header_bytes
        seen = self._head_tail + data
        end = seen.find(_HEAD_END)
        if end < 0:
            self.head_bytes += len(data)
            self._head_tail = seen[-(len(_HEAD_END) - 1) :]
            return self.head_bytes > limit
        # The head ends in this read (body bytes may follow it).
        size = self.head_bytes + end + len(_HEAD_END) - len(self._head_tail)
        self.head_bytes += len(data)
        return size > limit + len(_HEAD_END)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport.is_closing() or self.head_bytes is None:
            return
        if self.head_bytes or self._head_tail:
            self._refuse(
                RequestTimeout(
                    f"The request headers did not arrive within {self.limits.header_timeout_s:g} s "
                    "(see MICROSCHEDULER_SERVER__HEADER_TIMEOUT_S)."
                )
            )
        else:
            self.transport.close()

    def _idle(self) -> bool:
        in_flight = self.cycle is not None and not self.cycle.response_complete
        return not in_flight and self.head_bytes == 0

    def _evict_one(self) -> bool:
        """Close the connection idle longest to make room; False when none is idle."""
        idle = [
            c
            for c in self.connections
            if c is not self and isinstance(c, GatewayProtocol) and c._idle()
        ]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.idle_since)
        self.connections.discard(victim)
        victim._disarm_head_timer()
        victim.transport.close()
        return True

    def _refuse(self, err: GatewayError) -> None:
        """Answer outside the parser (no request was parsed) and close."""
        self._disarm_head_timer()
        self.transport.write(raw_response(err))
        self.transport.close()


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
