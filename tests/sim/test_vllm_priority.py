"""The fake vLLM's `priority`, as vLLM's: refused unless `--scheduling-policy priority`,
and with it, requests waiting for a slot start by priority (lower first)."""

from __future__ import annotations

import asyncio

import pytest

from app.sim.vllm import parse_args
from tests.fakes.servers import fake_vllm
from tests.fakes.waits import until

REQUESTS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/embeddings", {"input": "hi"}),
    ("/v1/responses", {"input": "hi"}),
]


@pytest.mark.parametrize(("path", "body"), REQUESTS)
async def test_a_priority_without_the_policy_is_accepted_and_ignored(
    path: str, body: dict[str, str]
) -> None:
    """vLLM 0.33 (vllm/v1/core/sched/request_queue.py FCFSRequestQueue): fcfs takes any
    integer priority and orders by arrival; a non-integer is still a validation error."""
    async with fake_vllm(models=["m"]) as fake:
        taken = await fake.client.post(path, json={**body, "model": "m", "priority": 3})
        assert taken.status_code == 200
        wrong = await fake.client.post(path, json={**body, "model": "m", "priority": "high"})
        assert wrong.status_code == 400
        assert wrong.json()["error"]["param"] == "body.priority"


async def test_without_the_policy_waiting_requests_start_by_arrival() -> None:
    async with fake_vllm(models=["m"], max_num_seqs=1, tokens_per_second=40) as fake:
        done: list[str] = []

        async def ask(name: str, priority: int) -> None:
            body = {"model": "m", "prompt": "hi", "max_tokens": 4, "priority": priority}
            response = await fake.client.post("/v1/completions", json=body)
            assert response.status_code == 200
            done.append(name)

        async def in_flight(n: int) -> bool:
            count: int = (await fake.stats())["in_flight"]
            return count == n

        running = asyncio.create_task(ask("running", 0))
        await until(lambda: in_flight(1), what="the first request running")
        low = asyncio.create_task(ask("low", 5))
        await until(lambda: in_flight(2), what="the low request waiting")
        high = asyncio.create_task(ask("high", -5))
        await until(lambda: in_flight(3), what="the high request waiting")
        await asyncio.wait_for(asyncio.gather(running, low, high), 10)
        assert done == ["running", "low", "high"]


@pytest.mark.parametrize(("path", "body"), REQUESTS)
async def test_with_the_policy_any_integer_priority_is_taken(
    path: str, body: dict[str, str]
) -> None:
    async with fake_vllm(models=["m"], scheduling_policy="priority") as fake:
        taken = await fake.client.post(path, json={**body, "model": "m", "priority": -1})
        assert taken.status_code == 200
        wrong = await fake.client.post(path, json={**body, "model": "m", "priority": "high"})
        assert wrong.status_code == 400
        assert wrong.json()["error"]["param"] == "body.priority"


async def test_waiting_requests_start_by_priority_then_arrival() -> None:
    async with fake_vllm(
        models=["m"], scheduling_policy="priority", max_num_seqs=1, tokens_per_second=40
    ) as fake:
        done: list[str] = []

        async def ask(name: str, priority: int) -> None:
            body = {"model": "m", "prompt": "hi", "max_tokens": 4, "priority": priority}
            response = await fake.client.post("/v1/completions", json=body)
            assert response.status_code == 200
            done.append(name)

        async def waiting(n: int) -> bool:
            in_flight: int = (await fake.stats())["in_flight"]
            return in_flight == n

        running = asyncio.create_task(ask("running", 0))
        await until(lambda: waiting(1), what="the first request running")
        low = asyncio.create_task(ask("low", 5))
        await until(lambda: waiting(2), what="the low request waiting")
        high = asyncio.create_task(ask("high", -5))
        await until(lambda: waiting(3), what="the high request waiting")
        await asyncio.wait_for(asyncio.gather(running, low, high), 10)
        assert done == ["running", "high", "low"]


def test_the_flag_sets_the_policy() -> None:
    assert parse_args([]).scheduling_policy == "fcfs"
    assert parse_args(["--scheduling-policy", "priority"]).scheduling_policy == "priority"
    with pytest.raises(SystemExit):
        parse_args(["--scheduling-policy", "lifo"])
