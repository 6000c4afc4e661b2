"""SSE comments before the first event are not the first content byte: an upstream like
vLLM with `--sse-keep-alive-interval` (`: keep-alive` comments while a request waits,
vllm/entrypoints/serve/utils/sse_keep_alive.py in 0.33) that then sends an error as its
first event is still failed over; one that then streams normally is relayed byte for
byte. The upstream is a real aiohttp server on 127.0.0.1 whose pauses are gates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from app.errors import UpstreamTimeout
from app.settings import Settings, TimeoutsConfig
from app.upstreams.http import HttpUpstream
from tests.fakes.provider import cloud_settings
from tests.fakes.servers import fake_vllm, gateway, serve_app

PING = b": keep-alive\n\n"  # vLLM 0.33: SSE_KEEP_ALIVE_COMMENT
# vLLM 0.33 chat_completion/serving.py: `data: {create_streaming_error_response(e)}` then [DONE]
ERROR = (
    b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
    b'"param": null, "code": 500}}\n\ndata: [DONE]\n\n'
)
CHUNKS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"ping-model","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":"he"},"finish_reason":null}]}\n\n',
    b": keep-alive\n\n",  # between tokens too
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"ping-model","choices":'
    b'[{"index":0,"delta":{"content":"llo"},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]


class Pinger:
    """A streaming upstream: `pings` keep-alive comments, each written on its own, then
    (once `release` is set) `after`, each part written on its own."""

    def __init__(self, pings: int, after: list[bytes]) -> None:
        self.pings = pings
        self.after = after
        self.pinged = asyncio.Event()  # every ping written
        self.release = asyncio.Event()
        self.requests = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(self.pings):
            await response.write(PING)
        self.pinged.set()
        await self.release.wait()
        for part in self.after:
            await response.write(part)
        await response.write_eof()
        return response

    @property
    def sent(self) -> bytes:
        return PING * self.pings + b"".join(self.after)


@asynccontextmanager
async def pinger_at(pinger: Pinger) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", pinger.handle)
    app.router.add_get("/health", _ok)
    async with serve_app(app) as url:
        try:
            yield url
        finally:
            pinger.release.set()  # let a held handler end before the server goes


async def _ok(_request: web.Request) -> web.Response:
    return web.Response()


BODY = b'{"model":"ping-model","stream":true,"messages":[{"role":"user","content":"hi"}]}'
CHAINED = BODY.replace(b'"ping-model"', b'"pinged"')  # the name whose chain is pinger, reasoning
HEADERS = {"content-type": "application/json"}


async def test_the_first_chunk_runs_past_comments_to_the_first_event() -> None:
    pinger = Pinger(3, [ERROR])
    async with pinger_at(pinger) as url:
        upstream = HttpUpstream("pinger", url, TimeoutsConfig(first_byte_s=10))
        try:
            opening = asyncio.create_task(upstream.open("/v1/chat/completions", BODY, HEADERS))
            await pinger.pinged.wait()
            # Comments only: still waiting for content (before the fix it returned here).
            done, _ = await asyncio.wait({opening}, timeout=0.3)
            assert not done
            pinger.release.set()
            response = await opening
            body = response.first_chunk + b"".join([c async for c in response.rest()])
            response.release()
        finally:
            await upstream.close()
    assert response.first_chunk.startswith(PING * 3 + b'data: {"error"')
    assert body == pinger.sent  # nothing dropped or rewritten


async def test_comments_alone_until_the_first_byte_timeout_are_a_first_byte_timeout() -> None:
    pinger = Pinger(2, [CHUNKS[0]])  # never released
    async with pinger_at(pinger) as url:
        upstream = HttpUpstream("pinger", url, TimeoutsConfig(first_byte_s=0.3))
        try:
            with pytest.raises(UpstreamTimeout) as raised:
                await upstream.open("/v1/chat/completions", BODY, HEADERS)
        finally:
            await upstream.close()
    assert raised.value.kind == "first_byte_timeout"
    assert "only SSE comments" in raised.value.message


def chain_settings(pinger_url: str, local_url: str, tmp_path: Path, **pinger: Any) -> Settings:
    backends = {
        "pinger": {"url": pinger_url, "models": ["ping-model"], "aliases": ["pinged"], **pinger},
        "reasoning": {"url": local_url, "models": ["local-model"]},
    }
    chains = {"pinged": {"entries": ["pinger", "reasoning"]}}
    return cloud_settings(backends, {}, chains, state_dir=tmp_path / "var")


async def test_an_error_event_after_keep_alives_falls_back(tmp_path: Path) -> None:
    pinger = Pinger(3, [ERROR])
    pinger.release.set()
    async with (
        pinger_at(pinger) as url,
        fake_vllm(models=["local-model"], max_tokens=3) as local,
        gateway(chain_settings(url, local.url, tmp_path)) as gw,
    ):
        response = await gw.client.post("/v1/chat/completions", content=CHAINED, headers=HEADERS)
    assert response.status_code == 200, response.text
    assert response.headers["x-microscheduler-route"] == "reasoning"
    assert response.headers["x-microscheduler-fallbacks"] == "1; pinger=stream_error"
    assert pinger.requests == 1
    assert "error" not in response.text
    assert response.text.rstrip().endswith("data: [DONE]")


async def test_keep_alives_that_outlast_the_first_byte_timeout_fall_back(tmp_path: Path) -> None:
    pinger = Pinger(2, [CHUNKS[0]])  # never released
    timeouts = {"timeouts": {"first_byte_s": 0.3}}
    async with (
        pinger_at(pinger) as url,
        fake_vllm(models=["local-model"], max_tokens=3) as local,
        gateway(chain_settings(url, local.url, tmp_path, **timeouts)) as gw,
    ):
        response = await gw.client.post("/v1/chat/completions", content=CHAINED, headers=HEADERS)
    assert response.status_code == 200, response.text
    assert response.headers["x-microscheduler-route"] == "reasoning"
    assert response.headers["x-microscheduler-fallbacks"].startswith("1; pinger=")


async def test_keep_alives_then_a_normal_stream_are_relayed_byte_for_byte(tmp_path: Path) -> None:
    pinger = Pinger(3, CHUNKS)
    pinger.release.set()
    async with (
        pinger_at(pinger) as url,
        gateway(
            cloud_settings(
                {"pinger": {"url": url, "models": ["ping-model"]}}, {}, {}, state_dir=tmp_path
            )
        ) as gw,
    ):
        response = await gw.client.post("/v1/chat/completions", content=BODY, headers=HEADERS)
    assert response.status_code == 200, response.text
    assert response.content == pinger.sent
