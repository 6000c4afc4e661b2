"""A stream that went out as 200 and ended with an error is recorded as one: its activity
entry and its access line keep the status that went out (200) and say the error
(`stream_error`), whether the upstream wrote the error event (vLLM's in-stream error,
then `[DONE]`) or the gateway did (the upstream broke off after the first byte). The
upstreams are real servers on 127.0.0.1; the gateway runs in process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from aiohttp import web

from app.services import Services
from tests.fakes.servers import (
    Gateway,
    fake_vllm,
    gateway,
    gateway_settings,
    serve_app,
)

CHUNK = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":"he"},"finish_reason":null}]}\n\n'
)
# vLLM 0.33 chat_completion/serving.py:505: the error event, then [DONE] (each written on
# its own, as vLLM yields them).
ERROR = (
    b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
    b'"param": null, "code": 500}}\n\n'
)
DONE = b"data: [DONE]\n\n"
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


class Scripted:
    """A streaming upstream that writes `parts`, each on its own, then ends."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for part in self.parts:
            await response.write(part)
        await response.write_eof()
        return response


@asynccontextmanager
async def scripted_gateway(parts: list[bytes]) -> AsyncIterator[Gateway]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", Scripted(parts).handle)
    app.router.add_get("/health", _ok)
    async with serve_app(app) as url:
        settings = gateway_settings({"b": {"url": url, "models": ["m"]}}, access_log=True)
        async with gateway(settings) as gw:
            yield gw


async def _ok(_request: web.Request) -> web.Response:
    return web.Response()


async def newest(gw: Gateway) -> dict[str, Any]:
    response = await gw.client.get("/activity", params={"limit": 1})
    assert response.status_code == 200
    entry: dict[str, Any] = response.json()["entries"][0]
    return entry


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "app.access" and "path=/v1/chat/completions" in r.getMessage()
    ]


@pytest.mark.parametrize(
    "parts",
    [[CHUNK, ERROR, DONE], [CHUNK, ERROR + DONE], [CHUNK + ERROR + DONE]],
    ids=["apart", "error-with-done", "one-chunk"],
)
async def test_the_upstreams_error_event_is_recorded(
    caplog: pytest.LogCaptureFixture, parts: list[bytes]
) -> None:
    caplog.set_level(logging.INFO, logger="app.access")
    async with scripted_gateway(parts) as gw:
        response = await gw.client.post("/v1/chat/completions", json=BODY)
        entry = await newest(gw)
    assert response.status_code == 200
    assert response.content == b"".join(parts)  # relayed as it came
    assert (entry["status"], entry["stream_error"]) == (200, "upstream_500")
    (line,) = access_lines(caplog)
    assert "status=200 " in line
    assert line.endswith(" stream_error=upstream_500")


async def test_a_stream_that_ends_well_has_no_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="app.access")
    async with scripted_gateway([CHUNK, DONE]) as gw:
        response = await gw.client.post("/v1/chat/completions", json=BODY)
        entry = await newest(gw)
    assert response.status_code == 200
    assert (entry["status"], entry["stream_error"]) == (200, None)
    (line,) = access_lines(caplog)
    assert "stream_error" not in line


async def test_the_gateways_own_error_event_is_recorded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="app.access")
    async with fake_vllm(models=["m"]) as upstream:
        settings = gateway_settings({"b": {"url": upstream.url, "models": ["m"]}}, access_log=True)
        async with gateway(settings) as gw:
            await upstream.set_faults(drop_after=3)  # broken off after the first byte
            response = await gw.client.post("/v1/chat/completions", json=BODY)
            entry = await newest(gw)
    assert response.status_code == 200
    assert '"code":"upstream_unavailable"' in response.text  # the gateway's event
    assert (entry["status"], entry["stream_error"]) == (200, "upstream_unavailable")
    (line,) = access_lines(caplog)
    assert "status=200 " in line
    assert line.endswith(" stream_error=upstream_unavailable")


@pytest.mark.parametrize(
    ("path", "chunks", "ended"),
    [
        ("/v1/chat/completions", 1, '"code":"gateway_stopping"'),
        # Ollama's NDJSON stream (app.api.ollama): its last line is the error. Its first
        # line is the first content (the role's chunk, empty, writes none).
        ("/api/chat", 2, '{"error":"The gateway is shutting down'),
    ],
)
async def test_a_stream_the_stopping_gateway_ended_is_recorded(
    path: str, chunks: int, ended: str
) -> None:
    async with fake_vllm(models=["m"]) as upstream:
        settings = gateway_settings({"b": {"url": upstream.url, "models": ["m"]}})
        async with gateway(settings) as gw:
            services: Services = gw.app.state.services
            await upstream.set_faults(stall_after=chunks)  # the stream stays open
            # The client's side of the ASGI app: the stream has begun once a body chunk
            # went out (before that, a stopping gateway answers 503, not in-band).
            begun = asyncio.Event()

            async def watched(scope: Any, receive: Any, send: Any) -> None:
                async def sending(message: Any) -> None:
                    await send(message)
                    if message["type"] == "http.response.body" and message.get("body"):
                        begun.set()

                await gw.app(scope, receive, sending)

            transport = httpx.ASGITransport(app=watched, client=("127.0.0.1", 50000))
            async with httpx.AsyncClient(
                transport=transport, base_url="http://localhost", timeout=10
            ) as client:
                ask = asyncio.create_task(client.post(path, json=BODY))
                await asyncio.wait_for(begun.wait(), 10)
                assert services.relays.end_all() == 1  # as a gateway stopping does
                response = await ask
            entry = await newest(gw)
    assert response.status_code == 200
    assert ended in response.text  # ended in-band
    assert (entry["status"], entry["stream_error"]) == (200, "gateway_stopping")
