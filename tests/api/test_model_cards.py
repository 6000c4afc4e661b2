"""`GET /v1/models` keeps vLLM's `max_model_len` per model (vllm/entrypoints/serve/engine/
protocol.py `ModelCard`): what the backend's server said, else its configured
`model_info.max_model_len`, null when neither is known; aliases, adapters and replica
groups included. Real fake vLLM servers on 127.0.0.1, the gateway in process."""

from __future__ import annotations

from typing import Any

import openai

from tests.fakes.servers import fake_vllm, gateway, gateway_settings, sdk_http


async def test_each_card_has_its_servers_max_model_len() -> None:
    async with (
        fake_vllm(models=["chat-model"], max_model_len=4096) as chat,
        fake_vllm(models=["group-model"], max_model_len=8192) as wide,
        fake_vllm(models=["group-model"], max_model_len=2048) as narrow,
    ):
        backends: dict[str, dict[str, Any]] = {
            "chat": {
                "url": chat.url,
                "models": ["chat-model"],
                "aliases": ["default"],
                "adapters": {"sql-lora": "/adapters/sql"},
            },
            # A replica group: a request may reach either, so the smaller one's.
            "wide": {"url": wide.url, "models": ["group-model"], "replica_of": "g"},
            "narrow": {"url": narrow.url, "models": ["group-model"], "replica_of": "g"},
            # Lazy and never started: its server has said nothing; configured, then not.
            "described": {
                "url": "http://127.0.0.1:9",
                "models": ["described-model"],
                "lifecycle": "lazy",
                "model_info": {"catalog": "qwen3-8b", "max_model_len": 16384},
                "runtime": {"kind": "process", "command": ["true"]},
            },
            "unknown": {
                "url": "http://127.0.0.1:10",
                "models": ["unknown-model"],
                "lifecycle": "lazy",
                "vram_mib": 1000,
                "runtime": {"kind": "process", "command": ["true"]},
            },
        }
        async with gateway(gateway_settings(backends)) as gw, sdk_http(gw) as http:
            response = await gw.client.get("/v1/models")
            assert response.status_code == 200
            listed = {card["id"]: card["max_model_len"] for card in response.json()["data"]}
            retrieved = await gw.client.get("/v1/models/default")
            # The official SDK keeps the field (its Model allows extra fields).
            sdk = openai.AsyncOpenAI(
                api_key="none", base_url="http://gateway/v1", http_client=http, max_retries=0
            )
            page = await sdk.models.list()
    assert listed == {
        "chat-model": 4096,
        "default": 4096,  # an alias: its backend's
        "sql-lora": 4096,  # an adapter: served within its base model's
        "group-model": 2048,
        "described-model": 16384,
        "unknown-model": None,
    }
    assert retrieved.json()["max_model_len"] == 4096
    by_id = {model.id: model for model in page.data}
    assert getattr(by_id["chat-model"], "max_model_len", None) == 4096
