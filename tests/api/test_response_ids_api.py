"""The stored-response ids through the gateway: one key creating responses in a loop
cannot make the gateway forget another key's (each key has a share of the map)."""

from __future__ import annotations

import pytest

from tests.fakes.servers import fake_vllm, gateway, gateway_settings

SECRET = "sk-batch-0123"


async def test_one_key_creating_responses_cannot_evict_another_keys_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATCH_KEY", SECRET)
    monkeypatch.setenv("FAMILY_KEY", "sk-family-0123")
    keys = {"batch": {"key_env": "BATCH_KEY"}, "family": {"key_env": "FAMILY_KEY"}}
    family = {"authorization": "Bearer sk-family-0123"}
    batch = {"authorization": f"Bearer {SECRET}"}
    async with fake_vllm(models=["m"], responses_store=True) as fake:
        settings = gateway_settings(
            {"b": {"url": fake.url, "models": ["m"]}},
            client_keys={"keys": keys},
            responses_max_ids=8,
            responses_max_ids_per_key=3,
        )
        async with gateway(settings) as gw:
            body = {"model": "m", "input": "hi", "max_output_tokens": 2}
            kept = await gw.client.post("/v1/responses", json=body, headers=family)
            kept_id = kept.json()["id"]
            flood = []
            for _ in range(12):  # more than the whole map holds
                made = await gw.client.post("/v1/responses", json=body, headers=batch)
                flood.append(made.json()["id"])
            found = await gw.client.get(f"/v1/responses/{kept_id}", headers=family)
            assert found.status_code == 200, found.text
            newest = await gw.client.get(f"/v1/responses/{flood[-1]}", headers=batch)
            assert newest.status_code == 200
            oldest = await gw.client.get(f"/v1/responses/{flood[0]}", headers=batch)
            assert oldest.status_code == 404
            assert oldest.json()["error"]["code"] == "response_not_found"
