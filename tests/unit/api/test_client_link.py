"""The gateway's own connections give each request a `ClientLink` in its scope: the
relay is told there that its client left, and `BodyGuard` that the body is all in
(`app.api.client_link`), without a task or a timer of their own."""

from __future__ import annotations

import asyncio
import gc
import weakref

from starlette.types import Receive, Scope, Send

from app.api.client_link import ClientLink, link_of
from tests.unit.api.test_one_write import serve


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def no_content(send: Send) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_a_connection_lost_mid_response_tells_the_watcher() -> None:
    links: list[ClientLink] = []
    told: list[str] = []
    release = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        link = link_of(scope)
        assert link is not None
        links.append(link)
        link.watch(lambda: told.append("gone"))
        await release.wait()  # stands in for the wait for the upstream

    protocol, _ = serve(app)
    protocol.data_received(b"GET /x HTTP/1.1\r\nhost: gw\r\n\r\n")
    await turns()
    assert len(links) == 1
    assert told == []
    protocol.connection_lost(None)
    assert told == ["gone"]
    assert protocol.watched == set()
    release.set()
    await turns()


async def test_the_link_says_the_body_is_in_only_once_its_last_byte_is() -> None:
    seen: list[bool] = []
    more = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        link = link_of(scope)
        assert link is not None
        seen.append(link.body_in())
        await more.wait()
        seen.append(link.body_in())
        message = await receive()  # does not wait: the body is all in
        assert message["body"] == b"abcdef"
        assert not message["more_body"]
        await no_content(send)

    protocol, transport = serve(app)
    protocol.data_received(b"POST /x HTTP/1.1\r\nhost: gw\r\ncontent-length: 6\r\n\r\nabc")
    await turns()
    protocol.data_received(b"def")
    more.set()
    await turns()
    assert seen == [False, True]
    assert transport.writes
    assert transport.writes[0].startswith(b"HTTP/1.1 204")


async def test_each_request_has_its_own_link() -> None:
    links: list[ClientLink | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        links.append(link_of(scope))
        await no_content(send)

    protocol, _ = serve(app)
    protocol.data_received(b"GET /a HTTP/1.1\r\nhost: gw\r\n\r\n")
    await turns()
    protocol.data_received(b"GET /b HTTP/1.1\r\nhost: gw\r\n\r\n")
    await turns()
    assert len(links) == 2
    assert links[0] is not None
    assert links[1] is not None
    assert links[0] is not links[1]
    assert link_of({}) is None  # another server's scope: the callers take the ASGI way


async def test_a_served_request_is_freed_without_the_garbage_collector() -> None:
    """A request's cycle holds its transport (`OneWrite`) and its scope (with the
    `ClientLink`); neither holds the cycle back strongly, nor `OneWrite` its spent
    handle: once the next request replaces it, the first is freed by reference counts
    alone. A reference cycle there left about 18 objects a request to the collector."""

    class Marker:
        """Something in the scope, freed with it."""

    markers: list[weakref.ref[Marker]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        marker = scope["test.marker"] = Marker()
        markers.append(weakref.ref(marker))
        del marker
        link = link_of(scope)
        assert link is not None
        link.watch(lambda: None)
        assert link.body_in()
        await no_content(send)
        link.unwatch()

    gc.disable()
    try:
        protocol, transport = serve(app)
        protocol.data_received(b"GET /a HTTP/1.1\r\nhost: gw\r\n\r\n")
        await turns()
        first = weakref.ref(protocol.cycle)
        protocol.data_received(b"GET /b HTTP/1.1\r\nhost: gw\r\n\r\n")
        await turns()
        assert len(transport.writes) == 2  # both answered
        assert first() is None
        assert markers[0]() is None  # its scope too
    finally:
        gc.enable()
