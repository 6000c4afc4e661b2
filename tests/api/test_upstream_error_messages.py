"""Errors to clients name an unreachable backend or provider by its configured name and
say what went wrong in a few words; its address and the exception (`Cannot connect to
host 127.0.0.1:PORT ...`) stay in the log and in the admin's `/backends` and `/status`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.api.test_fallback_triggers import world
from tests.fakes.processes import free_port
from tests.fakes.servers import gateway, gateway_settings

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_an_unreachable_backend_is_named_not_addressed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()  # nothing listens there: connection refused
    settings = gateway_settings({"b": {"url": f"http://127.0.0.1:{port}", "models": ["m"]}})
    async with gateway(settings) as gw:
        with caplog.at_level(logging.WARNING, logger="app.upstreams.http"):
            response = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 503
        message = response.json()["error"]["message"]
        assert message == "backend 'b' did not answer: connection refused"
        assert str(port) not in response.text
        assert "127.0.0.1" not in response.text
        # The detail, for whoever runs the gateway:
        logged = [r.getMessage() for r in caplog.records if r.name == "app.upstreams.http"]
        assert any(f"127.0.0.1:{port}" in line and "kind=connect" in line for line in logged)
        (view,) = (await gw.client.get("/backends")).json()["backends"]
        assert f"127.0.0.1:{port}" in view["upstream_error"]
        assert view["upstream_error"].split(" ", 1)[1].startswith("connect: ")


async def test_a_chains_summary_names_its_entries_not_their_addresses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    local_port, cloud_port = free_port(), free_port()
    async with world(
        monkeypatch,
        tmp_path,
        entries=["reasoning", "cloud"],
        backend={"url": f"http://127.0.0.1:{local_port}"},
        cloud={"base_url": f"http://127.0.0.1:{cloud_port}/v1"},
    ) as w:
        body = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}
        response = await w.gw.client.post("/v1/chat/completions", json=body)
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "fallback_exhausted"
        assert (
            "reasoning: backend 'reasoning' did not answer: connection refused"
            in (error["message"])
        )
        assert "cloud: provider 'cloud' did not answer: connection refused" in error["message"]
        for port in (local_port, cloud_port):
            assert str(port) not in response.text
        assert "127.0.0.1" not in response.text
