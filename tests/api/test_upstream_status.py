"""An upstream status no HTTP response can carry (999, 600): relayed, uvicorn had no status
line for it and dropped the client's connection. It is a 502 `upstream_bad_status` in the
envelope, naming the status, and the upstream connection is not kept."""

from __future__ import annotations

import pytest
from aiohttp import web

from tests.fakes.servers import gateway, gateway_settings, serve_app


@pytest.mark.parametrize("status", [999, 600])
async def test_an_odd_upstream_status_is_a_502_in_the_envelope(status: int) -> None:
    async def odd(request: web.Request) -> web.Response:
        return web.Response(status=status, text='{"ok": true}', content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", odd)
    async with serve_app(app) as url:
        settings = gateway_settings({"b": {"url": url, "models": ["m"]}})
        async with gateway(settings) as gw:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            response = await gw.client.post("/v1/chat/completions", json=body)
            assert response.status_code == 502, response.text
            assert response.headers["x-request-id"]
            error = response.json()["error"]
            assert error["code"] == "upstream_bad_status"
            assert error["type"] == "server_error"
            assert f"status {status}" in error["message"]
            metric = gw.registry.get_sample_value(
                "microscheduler_upstream_errors_total", {"backend": "b", "kind": "bad_status"}
            )
            assert metric == 1
