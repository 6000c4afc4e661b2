"""The events behind notifications that the request path raises: `fallback_to_cloud` (the
first per client key per hour, on the notifier's clock) and a key's daily cloud budget
passing 80 % and 100 % (`budget_80`, `budget_exhausted`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from app.keys.metrics import KeyMetrics
from app.keys.ring import ClientKey
from app.lifecycle.blocks import BlockKind
from app.notify.notifier import from_event
from app.services import Services
from app.settings.keys import KeyConfig
from tests.fakes.provider import cloud_settings, fake_openai_provider
from tests.fakes.servers import fake_vllm, gateway

CHAT = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}


async def test_fallback_to_cloud_is_said_once_per_key_per_hour(
    monkeypatch: Any, tmp_path: Path
) -> None:
    monkeypatch.setenv("CLOUD_KEY", "sk-test")
    async with (
        fake_vllm(models=["local-model"], max_tokens=4) as local,
        fake_openai_provider("sk-test") as cloud,
    ):
        settings = cloud_settings(
            {"reasoning": {"url": local.url, "models": ["local-model"], "aliases": ["reasoning"]}},
            {"cloud": {"kind": "openai", "base_url": cloud.base_url,
                       "api_key_env": "CLOUD_KEY", "model": "cloud-model"}},
            {"reasoning": ["reasoning", "cloud"]},
            state_dir=tmp_path / "var",
        )  # fmt: skip
        async with gateway(settings) as gw:
            services: Services = gw.app.state.services
            now = [1000.0]
            services.notifier.clock = lambda: now[0]
            services.backends["reasoning"].block("t", "a test", kind=BlockKind.YIELDED)

            def said() -> list[dict[str, Any]]:
                return [e for e in services.events.recent() if e["kind"] == "fallback_to_cloud"]

            for _ in range(3):
                response = await gw.client.post("/v1/chat/completions", json=CHAT)
                assert response.status_code == 200, response.text
            assert len(said()) == 1
            first = said()[0]
            assert first["key"] == "anonymous"
            assert first["provider"] == "cloud"
            assert first["passed"] == ["reasoning"]
            assert from_event(first) == ("fallback_to_cloud", {
                k: v for k, v in first.items() if k not in ("seq", "at", "kind")})  # fmt: skip
            now[0] += 3599
            assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            assert len(said()) == 1
            now[0] += 2  # an hour and a second after the first
            assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            assert len(said()) == 2
            # Answered locally: no fallback, nothing said.
            services.backends["reasoning"].unblock("t")
            now[0] += 7200
            assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            assert len(said()) == 2


def test_the_daily_cloud_budget_says_80_percent_and_exhausted_once_each() -> None:
    config = KeyConfig(key_sha256="0" * 64, daily_cloud_tokens=100)
    key = ClientKey("team", config, KeyMetrics(CollectorRegistry()), wall=lambda: 86400.0 * 5)
    heard: list[tuple[str, dict[str, Any]]] = []
    key.on_budget = lambda level, **fields: heard.append((level, fields))
    use = key.admit()
    use.count("cloud", True, 50, 20)  # 70
    use.count("local", False, 50, 50)  # local tokens are not the cloud budget's
    assert heard == []
    use.count("cloud", True, 10, 0)  # 80
    assert heard == [("budget_80", {"key": "team", "spent": 80, "daily_cloud_tokens": 100})]
    use.count("cloud", True, 5, 0)
    use.count("cloud", True, 30, 0)  # 115
    assert [level for level, _ in heard] == ["budget_80", "budget_exhausted"]
    use.count("cloud", True, 30, 0)
    assert len(heard) == 2
