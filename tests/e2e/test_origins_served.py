"""Browser pages of other sites cannot drive `microscheduler serve` (uvicorn, the
gateway's protocol, the fast path) as a real process: the in-process checks of
tests/api/test_origins.py, through the server that answers them."""

from __future__ import annotations

import httpx
import pytest

from tests.api.test_origins import BACKENDS, EVIL, SIMPLE, assert_refused
from tests.fakes.processes import gateway_process

pytestmark = pytest.mark.e2e


def test_through_a_real_server() -> None:
    """`microscheduler serve` (uvicorn, the gateway's protocol, the fast path)."""
    models = {"backends": BACKENDS, "gpu": {"probe": "sim"}}
    with gateway_process(models) as gw, httpx.Client(base_url=gw.url, timeout=10) as client:
        port = gw.url.rsplit(":", 1)[1]
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        response = client.post(
            "/v1/chat/completions", content=body, headers={**SIMPLE, "origin": EVIL}
        )
        assert_refused(response)
        assert response.headers["connection"] == "close"  # the body was not read
        response = client.post("/vram/yield", content=b"{}", headers={**SIMPLE, "origin": EVIL})
        assert_refused(response)
        assert client.get("/vram/yield").json()["state"] == "none"
        # The gateway's own origin passes (the backend is down: 503, not 403).
        own = {"origin": gw.url}
        response = client.post("/v1/chat/completions", content=body, headers={**SIMPLE, **own})
        assert response.status_code == 503, response.text
        assert client.get("/status", headers={"host": "evil.example"}).status_code == 403
        assert client.get("/status", headers={"host": f"127.0.0.1:{port}"}).status_code == 200
        assert client.get("/docs").status_code == 404
