"""Once the gateway has ended its open relays (shortly before its shutdown grace is over),
a request that still reaches a model API is refused at once, in the envelope of its API,
rather than started and cut when the server's grace runs out."""

from __future__ import annotations

from app.main import RELAY_END_MARGIN_S, relay_end_delay
from app.services import Services
from tests.fakes.servers import fake_vllm, gateway, gateway_settings

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
MESSAGES = {**CHAT, "max_tokens": 4}


async def test_a_request_after_the_relays_were_ended_is_a_503_gateway_stopping() -> None:
    async with fake_vllm(models=["m"], max_tokens=2) as upstream:
        settings = gateway_settings({"m": {"url": upstream.url, "models": ["m"]}})
        async with gateway(settings) as gw:
            services: Services = gw.app.state.services
            assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            assert len(services.relays) == 0  # a finished relay is not kept
            assert services.relays.end_all() == 0
            chat = await gw.client.post("/v1/chat/completions", json=CHAT)
            assert chat.status_code == 503
            assert chat.json()["error"]["code"] == "gateway_stopping"
            assert chat.headers["x-request-id"]
            messages = await gw.client.post("/v1/messages", json=MESSAGES)
            assert messages.status_code == 503
            assert messages.json()["type"] == "error"
            assert "shutting down" in messages.json()["error"]["message"]
            ollama = await gw.client.post("/api/chat", json={**CHAT, "stream": False})
            assert ollama.status_code == 503
            assert "shutting down" in ollama.json()["error"]  # Ollama's {"error": "..."}


def test_relays_end_a_margin_before_the_grace_or_at_half_a_short_one() -> None:
    assert relay_end_delay(10.0) == 10.0 - RELAY_END_MARGIN_S
    assert relay_end_delay(1.0) == 0.5
