"""An idle backend's server is polled less (`app.control.polling`): its `/health` and
`/metrics` are not asked every round while nobody uses it (each poll is a line in its
access log), and are again every round as soon as a request is in flight. The server is a
real aiohttp app on 127.0.0.1 that counts the polls; the gateway runs in process, its
rounds every 0.05 s, the polls' clock 10 minutes ahead (the backend idle that long)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from app.services import Seams
from tests.fakes.servers import Gateway, gateway, gateway_settings, serve_app, until_backend
from tests.fakes.waits import until

ROUND_S = 0.05
AHEAD_S = 600.0  # what the polls' clock adds: the backend has been idle 10 minutes
CHUNK = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":"he"},"finish_reason":null}]}\n\n'
)
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


class Polled:
    """A server that counts its `/health` and `/metrics` requests and holds each chat
    stream after its first event until `release` is set."""

    def __init__(self) -> None:
        self.health = 0
        self.metrics = 0
        self.release = asyncio.Event()

    async def on_health(self, _request: web.Request) -> web.Response:
        self.health += 1
        return web.Response()

    async def on_metrics(self, _request: web.Request) -> web.Response:
        self.metrics += 1
        return web.Response(text="", content_type="text/plain")

    async def on_chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(CHUNK)
        await self.release.wait()
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def counts(self) -> tuple[int, int]:
        return self.health, self.metrics


@asynccontextmanager
async def polled_gateway(server: Polled) -> AsyncIterator[Gateway]:
    app = web.Application()
    app.router.add_get("/health", server.on_health)
    app.router.add_get("/metrics", server.on_metrics)
    app.router.add_post("/v1/chat/completions", server.on_chat)
    async with serve_app(app) as url:
        settings = gateway_settings(
            {"b": {"url": url, "models": ["m"]}},
            health_interval_s=ROUND_S,
            gpu={"probe": "sim", "poll_interval_s": ROUND_S},
        )
        seams = Seams(poll_clock=lambda: time.monotonic() + AHEAD_S)
        try:
            async with gateway(settings, seams=seams) as gw:
                yield gw
        finally:
            server.release.set()


async def test_an_idle_server_is_polled_less_and_a_busy_one_every_round() -> None:
    server = Polled()
    async with polled_gateway(server) as gw:
        await until(lambda: server.metrics >= 1, what="the first scrape")
        idle_from = server.counts()
        await asyncio.sleep(10 * ROUND_S)  # the thing under test: ten rounds pass, idle
        idle_until = server.counts()
        ask = asyncio.create_task(gw.client.post("/v1/chat/completions", json=BODY))
        await until_backend(gw, "b", in_flight=1)
        busy_from = server.counts()
        # In use: every round again (a poll every 0.05 s).
        await until(lambda: server.health >= busy_from[0] + 3, what="health checks while busy")
        await until(lambda: server.metrics >= busy_from[1] + 3, what="scrapes while busy")
        server.release.set()
        response = await ask
    assert response.status_code == 200
    # Idle: none in ten rounds (the next is due 30 s after the last); before, one each round.
    assert idle_until == idle_from, (idle_from, idle_until)
