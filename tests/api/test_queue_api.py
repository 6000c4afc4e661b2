"""A backend's queue through the gateway, against the fake vLLM: requests beyond
`max_inflight` wait (counted in /metrics and /backends) and are served by key priority;
a backend with `scheduling: priority` gets the key's priority in the body, any other
backend the body as the client sent it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from asyncio import FIRST_COMPLETED
from pathlib import Path
from typing import Any

import pytest

from app.routing.exchange import Call
from app.services import Services
from app.settings.keys import Priority
from tests.api.test_fallback_triggers import world
from tests.fakes.servers import (
    FakeServer,
    Gateway,
    chat,
    fake_vllm,
    gateway,
    gateway_settings,
    until_backend,
)
from tests.fakes.waits import until

WAITING = 'microscheduler_requests_waiting{backend="b",reason="max_inflight"}'


async def upstream_in_flight(fake: FakeServer, n: int) -> bool:
    in_flight: int = (await fake.stats())["in_flight"]
    return in_flight == n


async def metric_line(gw: Gateway, name: str) -> str:
    text = (await gw.client.get("/metrics")).text
    return next(line for line in text.splitlines() if line.startswith(name))


async def hold_one(gw: Gateway, fake: FakeServer) -> asyncio.Task[Any]:
    """A request that holds the backend's one slot until the test cancels it."""
    await fake.set_faults(stall_before_headers=True)
    held = asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("m")))
    await until(lambda: upstream_in_flight(fake, 1), what="the first request upstream")
    await fake.set_faults(stall_before_headers=False)
    return held


async def test_a_request_beyond_max_inflight_waits_counted_then_is_served() -> None:
    async with fake_vllm(models=["m"]) as fake:
        backends = {"b": {"url": fake.url, "models": ["m"], "max_inflight": 1}}
        async with gateway(gateway_settings(backends)) as gw:
            assert await metric_line(gw, WAITING) == f"{WAITING} 0.0"
            held = await hold_one(gw, fake)
            second = asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("m")))
            view = await until_backend(gw, "b", queued=1)
            assert (view["in_flight"], view["waiting"], view["max_inflight"]) == (1, 1, 1)
            assert await metric_line(gw, WAITING) == f"{WAITING} 1.0"
            assert await upstream_in_flight(fake, 1)  # the second was not sent
            held.cancel()  # the client goes away: its slot goes to the queued request
            with contextlib.suppress(asyncio.CancelledError):
                await held
            response = await asyncio.wait_for(second, 5)
            assert response.status_code == 200
            assert await metric_line(gw, WAITING) == f"{WAITING} 0.0"


async def test_queued_requests_reach_a_priority_backend_in_key_order_with_its_priority() -> None:
    async with fake_vllm(models=["m"], scheduling_policy="priority") as fake:
        backends = {
            "b": {"url": fake.url, "models": ["m"], "max_inflight": 1, "scheduling": "priority"}
        }
        async with gateway(gateway_settings(backends)) as gw:
            services: Services = gw.app.state.services
            route = services.plane.dispatcher.route("m")

            def call(priority: Priority) -> Call:
                payload = chat("m", priority=-7)  # the client's own: never sent
                body = json.dumps(payload).encode()
                return Call(route, "/v1/chat/completions", payload, False, body, {},
                            priority=priority)  # fmt: skip

            held = await hold_one(gw, fake)
            low = asyncio.create_task(services.plane.dispatcher.open(call(Priority.LOW)))
            await until_backend(gw, "b", queued=1)
            high = asyncio.create_task(services.plane.dispatcher.open(call(Priority.HIGH)))
            await until_backend(gw, "b", queued=2)
            held.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await held
            done, _ = await asyncio.wait({low, high}, timeout=5, return_when=FIRST_COMPLETED)
            assert done == {high}
            high.result().finish()
            (await asyncio.wait_for(low, 5)).finish()
            sent = [r["body"] for r in (await fake.stats())["requests"]]
            assert [body["priority"] for body in sent] == [0, -1, 1]  # normal, high, low


async def test_a_client_cannot_set_the_priority_a_priority_backend_gets() -> None:
    async with fake_vllm(models=["m"], scheduling_policy="priority") as fake:
        backends = {
            "b": {"url": fake.url, "models": ["m"], "aliases": ["a"], "scheduling": "priority"}
        }
        async with gateway(gateway_settings(backends)) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat("a", priority=-9))
            assert response.status_code == 200
            sent = (await fake.stats())["requests"][-1]["body"]
            assert sent == {**chat("m"), "priority": 0}  # a key's normal priority


async def test_a_fcfs_backend_gets_the_clients_body_and_vllms_answer_to_it() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "priority": 3}'
    async with contextlib.AsyncExitStack() as stack:
        fake = await stack.enter_async_context(fake_vllm(models=["m"]))
        backends = {"b": {"url": fake.url, "models": ["m"]}}
        gw = await stack.enter_async_context(gateway(gateway_settings(backends)))
        response = await gw.client.post(
            "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
        # vLLM 0.33 takes and ignores a priority under fcfs (older vLLM answered 400)
        assert response.status_code == 200
        assert (await fake.stats())["requests"][-1]["body"] == json.loads(raw)


async def test_a_chains_local_entry_queues_by_the_calls_priority(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    backend = {"max_inflight": 1, "timeouts": {"first_byte_s": 30}}
    async with world(monkeypatch, tmp_path, entries=["reasoning", "cloud"], backend=backend) as w:
        dispatcher = w.services.plane.dispatcher
        route = dispatcher.route("reasoning")

        def call(priority: Priority) -> Call:
            payload = chat("reasoning", messages=[{"role": "user", "content": str(priority)}])
            body = json.dumps({**payload, "model": route.upstream_model}).encode()
            return Call(route, "/v1/chat/completions", payload, False, body, {},
                        priority=priority)  # fmt: skip

        await w.local.set_faults(stall_before_headers=True)
        held = asyncio.create_task(dispatcher.open(call(Priority.NORMAL)))
        await until(lambda: upstream_in_flight(w.local, 1), what="the first request upstream")
        await w.local.set_faults(stall_before_headers=False)
        low = asyncio.create_task(dispatcher.open(call(Priority.LOW)))
        await until_backend(w.gw, "reasoning", queued=1)
        high = asyncio.create_task(dispatcher.open(call(Priority.HIGH)))
        await until_backend(w.gw, "reasoning", queued=2)
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held
        done, _ = await asyncio.wait({low, high}, timeout=5, return_when=FIRST_COMPLETED)
        assert done == {high}
        first = high.result()
        assert first.backend == "reasoning"
        first.finish()
        (await asyncio.wait_for(low, 5)).finish()
        sent = [r["body"]["messages"][0]["content"] for r in (await w.local.stats())["requests"]]
        assert sent == ["normal", "high", "low"]
