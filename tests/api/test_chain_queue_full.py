"""A cold flood at a chain [local, paid provider]: a local backend whose queue is full
(`max_waiting`) answers its own 503 `backend_queue_full` with Retry-After instead of
spilling the burst to the provider, unless the chain (`fallback_on: [queue_full]`) or the
client's key opts in. One start, the held requests answered locally once it is ready."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.test_fallback_triggers import CLOUD_MODEL, LAZY, LOCAL_MODEL, World, world
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime
from tests.fakes.waits import until

MAX_WAITING = 3
BURST = 10
SECRET = "sk-rather-pay-than-wait"


async def flood(w: World, runtime: FakeVllmRuntime, **headers: str) -> list[httpx.Response]:
    """`BURST` requests at the cold model; the model comes up once the queue is full and
    the rest have had their answer (the order the finding saw: a 2.3 s start)."""
    backend = w.services.backends["reasoning"]
    body = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}
    tasks = [
        asyncio.create_task(w.gw.client.post("/v1/chat/completions", json=body, headers=headers))
        for _ in range(BURST)
    ]
    await until(lambda: backend.requests.waiting == MAX_WAITING, what="the queue to fill")
    await until(lambda: sum(t.done() for t in tasks) == BURST - MAX_WAITING)
    runtime.listening.set()
    return list(await asyncio.gather(*tasks))


def cold(runtime: FakeVllmRuntime) -> dict[str, Any]:
    return {**LAZY, "url": f"http://127.0.0.1:{runtime.port}", "max_waiting": MAX_WAITING}


def models(responses: list[httpx.Response]) -> list[str]:
    return sorted(r.json()["model"] for r in responses if r.status_code == 200)


async def test_a_full_local_queue_does_not_spill_to_the_provider_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runtime = FakeVllmRuntime(free_port(), open_at_start=False, models=[LOCAL_MODEL])
    async with world(
        monkeypatch, tmp_path, entries=["reasoning", "cloud"], backend=cold(runtime),
        runtime=runtime,
    ) as w:  # fmt: skip
        responses = await flood(w, runtime)
        assert models(responses) == [LOCAL_MODEL] * MAX_WAITING
        refused = [r for r in responses if r.status_code != 200]
        assert len(refused) == BURST - MAX_WAITING
        for response in refused:
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "backend_queue_full"
            assert response.headers["retry-after"] == "5"
        assert (await w.cloud.stats())["requests"] == []  # nothing paid for
        assert runtime.starts == 1
        circuit = w.services.plane.cloud.status().circuits["reasoning"]
        assert circuit.consecutive_failures == 0


@pytest.mark.parametrize("opt_in", ["chain", "key"])
async def test_a_chain_or_key_that_opts_in_spills_a_full_queue_to_the_provider(
    opt_in: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runtime = FakeVllmRuntime(free_port(), open_at_start=False, models=[LOCAL_MODEL])
    monkeypatch.setenv("PAYER_KEY", SECRET)
    keys: dict[str, dict[str, Any]] = {"payer": {"key_env": "PAYER_KEY"}}
    chain: dict[str, Any] = {}
    if opt_in == "chain":
        chain["fallback_on"] = ["queue_full"]
    else:
        keys["payer"]["fallback_on"] = ["queue_full"]
    async with world(
        monkeypatch, tmp_path, entries=["reasoning", "cloud"], backend=cold(runtime),
        runtime=runtime, chain=chain, client_keys={"keys": keys},
    ) as w:  # fmt: skip
        responses = await flood(w, runtime, authorization=f"Bearer {SECRET}")
        spilled = BURST - MAX_WAITING
        assert models(responses) == sorted([CLOUD_MODEL] * spilled + [LOCAL_MODEL] * MAX_WAITING)
        assert len((await w.cloud.stats())["requests"]) == spilled
        overflow = [r for r in responses if r.json()["model"] == CLOUD_MODEL]
        assert {r.headers["x-microscheduler-fallbacks"] for r in overflow} == {
            "1; reasoning=local_queue_full"
        }
        assert runtime.starts == 1
