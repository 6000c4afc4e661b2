"""Fair turns between client keys of one priority, through the gateway (issue 36, 1): a
backend with `max_inflight: 1` in front of the fake vLLM, two keys of keys.yaml. Key a
floods the queue with 100 requests, key b sends 5 after them: each of b's reaches the
backend within the next few slots, not after a's 100."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.fakes.servers import FakeServer, Gateway, chat, fake_vllm, gateway, gateway_settings
from tests.fakes.servers import until_backend as until_backend_is
from tests.fakes.waits import until

SECRETS = {"a": "sk-flood-a1", "b": "sk-later-b2"}


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, secret in SECRETS.items():
        monkeypatch.setenv(f"FAIR_{name.upper()}_KEY", secret)


def post(gw: Gateway, key: str, text: str) -> asyncio.Task[httpx.Response]:
    body = chat("m", messages=[{"role": "user", "content": text}])
    headers = {"authorization": f"Bearer {SECRETS[key]}"}
    return asyncio.create_task(gw.client.post("/v1/chat/completions", json=body, headers=headers))


async def newest_upstream(fake: FakeServer) -> str:
    """The text of the last request the fake received."""
    requests: list[dict[str, Any]] = (await fake.stats())["requests"]
    text: str = requests[-1]["body"]["messages"][0]["content"] if requests else ""
    return text


async def next_upstream(fake: FakeServer, after: str) -> str:
    """The text of the next request to reach the fake after the one of text `after`."""

    async def arrived() -> str | None:
        text = await newest_upstream(fake)
        return text if text != after else None

    return await until(arrived, what=f"a request to reach the backend after {after!r}")


async def test_a_key_sending_after_a_flood_is_served_within_the_next_few_slots() -> None:
    keys = {name: {"key_env": f"FAIR_{name.upper()}_KEY"} for name in SECRETS}
    async with fake_vllm(models=["m"]) as fake:
        backends = {"b": {"url": fake.url, "models": ["m"], "max_inflight": 1, "max_waiting": 128}}
        settings = gateway_settings(backends, client_keys={"keys": keys})
        async with gateway(settings) as gw:
            # Every request the backend gets stalls: the test frees its slot (its client
            # goes away) and reads which request got the slot next, one slot at a time.
            await fake.set_faults(stall_before_headers=True)
            tasks = {"held": post(gw, "a", "held")}
            assert await next_upstream(fake, "") == "held"
            tasks |= {f"a{i}": post(gw, "a", f"a{i}") for i in range(100)}
            await until_backend_is(gw, "b", queued=100)
            tasks |= {f"b{i}": post(gw, "b", f"b{i}") for i in range(5)}
            await until_backend_is(gw, "b", queued=105)
            order, current = [], "held"
            for _ in range(12):
                tasks.pop(current).cancel()
                current = await next_upstream(fake, current)
                order.append(current)
            await fake.set_faults(stall_before_headers=False)
            tasks.pop(current).cancel()
            responses = await asyncio.wait_for(asyncio.gather(*tasks.values()), 60)
            assert [r.status_code for r in responses] == [200] * (105 - 12)
    # b's five requests came after a's hundred: they take turns with a's
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3", "a4", "b4", "a5", "a6"]
