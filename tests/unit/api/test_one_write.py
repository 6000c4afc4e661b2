"""A response's status line and headers leave with its first body bytes, in one write to
the connection (`app.api.one_write.OneWrite`); a response that starts and then waits
still sends its head at the loop's next turn."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from app.api.connections import GatewayProtocol
from app.settings.root import ServerConfig

REQUEST = b"GET /x HTTP/1.1\r\nhost: gw\r\n\r\n"


class Transport(asyncio.Transport):
    """The connection as the protocol sees it: every write kept, nothing sent."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def serve(app: Any) -> tuple[GatewayProtocol, Transport]:
    config = uvicorn.Config(app, lifespan="off", log_config=None)
    config.load()
    protocol = GatewayProtocol.configured(ServerConfig())(
        config=config, server_state=ServerState(), app_state={}
    )
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


async def settle(protocol: GatewayProtocol) -> None:
    for _ in range(100):
        if protocol.cycle is not None and protocol.cycle.response_complete:
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_a_response_ready_at_once_leaves_in_one_write() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})

    protocol, transport = serve(app)
    protocol.data_received(REQUEST)
    await settle(protocol)
    assert len(transport.writes) == 1
    (written,) = transport.writes
    assert written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert written.endswith(b"\r\n\r\nok")
    protocol.connection_lost(None)


async def test_a_head_whose_body_waits_goes_out_at_the_next_turn() -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        started.set()
        await gate.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    protocol, transport = serve(app)
    protocol.data_received(REQUEST)
    await started.wait()
    await asyncio.sleep(0)
    assert len(transport.writes) == 1  # the head, alone: the body is not ready
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b"transfer-encoding: chunked\r\n\r\n")
    gate.set()
    await settle(protocol)
    assert transport.writes[1:] == [b"9\r\ndata: 1\n\n\r\n", b"0\r\n\r\n"]
    protocol.connection_lost(None)
