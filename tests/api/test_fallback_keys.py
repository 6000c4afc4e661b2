"""Provider keys: read from the variables the config names, sent only to their provider,
never logged, never in `/status`, `/metrics`, `Cloud.status()` or an error body, even when a
provider echoes the key it got in its own error."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from app.api.views import fallback_view
from app.lifecycle.blocks import BlockKind
from app.services import Services
from tests.fakes.provider import cloud_settings, fake_anthropic, fake_openai_provider
from tests.fakes.servers import fake_vllm, gateway

LEAK = "sk-live-LEAKCHECK-7f3a9c2e41"
CHAT = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}


async def test_keys_appear_in_no_log_status_metrics_or_error_body(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("CLOUD_KEY", LEAK)
    monkeypatch.setenv("CLAUDE_KEY", LEAK)
    async with (
        fake_vllm(models=["local-model"], max_tokens=4) as local,
        fake_openai_provider("sk-the-key-it-wants") as cloud,  # echoes a wrong key in its 401
        fake_anthropic("sk-ant-other") as claude,
    ):
        settings = cloud_settings(
            {"reasoning": {"url": local.url, "models": ["local-model"], "aliases": ["reasoning"]}},
            {
                "cloud": {
                    "kind": "openai",
                    "base_url": cloud.base_url,
                    "api_key_env": "CLOUD_KEY",
                    "model": "cloud-model",
                },
                "claude": {
                    "kind": "anthropic",
                    "base_url": claude.url,
                    "api_key_env": "CLAUDE_KEY",
                    "model": "claude-x",
                    "max_tokens": 100,
                },
            },
            {"reasoning": ["cloud", "claude", "reasoning"]},
            state_dir=tmp_path / "var",
        )
        async with gateway(settings) as gw:
            services: Services = gw.app.state.services
            services.backends["reasoning"].block("t", "a test", kind=BlockKind.YIELDED)
            texts: list[str] = []
            for body in (CHAT, {**CHAT, "stream": True}):
                response = await gw.client.post("/v1/chat/completions", json=body)
                assert response.status_code == 503
                texts += [response.text, json.dumps(dict(response.headers))]
            # Both providers were asked once, with the key, and refused it; their circuits
            # then opened, so the stream found every entry cooling down.
            assert cloud.unauthorized == 1
            assert claude.fake.received == 1
            assert all(r["key_ok"] is False for r in claude.fake.requests)
            texts.append((await gw.client.get("/metrics")).text)
            status = await gw.client.get("/status")
            assert status.status_code == 200
            assert status.json()["fallback"]["providers"]["cloud"]["key_present"] is True
            texts.append(status.text)
            texts.append(json.dumps(fallback_view(services.plane.cloud.status())))
            texts.append(repr(services.plane.cloud.status()))
            assert services.plane.cloud.status().providers["cloud"].key_present is True
    texts += [caplog.text, *(record.getMessage() for record in caplog.records)]
    for text in texts:
        assert LEAK not in text
        assert LEAK[-10:] not in text  # not even its tail


async def test_a_provider_whose_key_is_unset_is_skipped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("UNSET_CLOUD_KEY", raising=False)
    async with (
        fake_vllm(models=["local-model"], max_tokens=4) as local,
        fake_openai_provider("k") as cloud,
    ):
        settings = cloud_settings(
            {"reasoning": {"url": local.url, "models": ["local-model"], "aliases": ["reasoning"]}},
            {
                "cloud": {
                    "kind": "openai",
                    "base_url": cloud.base_url,
                    "api_key_env": "UNSET_CLOUD_KEY",
                    "model": "cloud-model",
                }
            },
            {"reasoning": ["cloud", "reasoning"]},
            state_dir=tmp_path / "var",
        )
        with caplog.at_level(logging.WARNING):
            async with gateway(settings) as gw:
                services: Services = gw.app.state.services
                response = await gw.client.post("/v1/chat/completions", json=CHAT)
                assert response.status_code == 200
                assert response.headers["x-microscheduler-fallbacks"] == "1; cloud=no_api_key"
                described = services.plane.cloud.status().providers["cloud"]
                assert described.key_present is False
                assert described.active is False
                assert described.api_key_env == "UNSET_CLOUD_KEY"
                assert cloud.calls == 0
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(
            "provider skipped" in m and "provider=cloud" in m and "UNSET_CLOUD_KEY" in m
            for m in warnings
        )
