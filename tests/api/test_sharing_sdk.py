"""Sharing one GPU, through the official `openai` SDK: the key's priority orders a
backend's queue (`max_inflight`), an old low-priority request is not starved, a model's
`min_resident_s` holds off a swap, and an idle backend sleeps and wakes on its next request.
(Keys' scopes and limits: test_client_keys.py.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.services import Services
from tests.api.test_lifecycle_api import backend_state, lazy, lifecycle_gateway
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeVllmRuntime,
    Gateway,
    fake_vllm,
    gateway,
    gateway_settings,
    sdk_http,
)
from tests.fakes.waits import until

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
SECRETS = {"HIGH_KEY": "sk-high", "NORMAL_KEY": "sk-normal", "LOW_KEY": "sk-low"}
KEYS = {
    "agents": {"key_env": "HIGH_KEY", "priority": "high"},
    "family": {"key_env": "NORMAL_KEY", "priority": "normal"},
    "batch": {"key_env": "LOW_KEY", "priority": "low"},
}


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


class Clients:
    def __init__(self, http: Any) -> None:
        self._http = http

    def __call__(self, secret: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key=secret, base_url="http://gateway/v1", http_client=self._http, max_retries=0
        )


@asynccontextmanager
async def queued_backend(**backend: Any) -> AsyncIterator[tuple[Gateway, Clients]]:
    """One backend answering 20 tokens a second, `max_inflight: 1`, three keys."""
    async with fake_vllm(models=["m"], tokens_per_second=20, max_tokens=64) as upstream:
        settings = gateway_settings(
            {"m": {"url": upstream.url, "models": ["m"], "max_inflight": 1, **backend}},
            client_keys={"keys": KEYS},
        )
        async with gateway(settings) as gw, sdk_http(gw) as http:
            yield gw, Clients(http)


def ask(
    client: openai.AsyncOpenAI, tokens: int, done: list[str], name: str
) -> asyncio.Future[None]:
    async def one() -> None:
        answer = await client.chat.completions.create(model="m", messages=HI, max_tokens=tokens)
        assert answer.choices[0].finish_reason == "length"
        done.append(name)

    return asyncio.ensure_future(one())


async def queued(gw: Gateway, n: int) -> bool:
    return bool((await backend_state(gw, "m"))["queued"] == n)


async def test_a_high_priority_request_queued_after_a_low_one_is_served_first() -> None:
    async with queued_backend() as (gw, clients):
        done: list[str] = []
        first = ask(clients("sk-normal"), 10, done, "normal")  # holds the one slot ~0.5 s
        services: Services = gw.app.state.services
        await until(
            lambda: services.backends["m"].requests.in_flight == 1, what="the first in flight"
        )
        low = ask(clients("sk-low"), 1, done, "low")
        await until(lambda: queued(gw, 1), what="the low request queued")
        high = ask(clients("sk-high"), 1, done, "high")
        await until(lambda: queued(gw, 2), what="the high request queued")
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_requests_waiting{backend="m",reason="max_inflight"} 2.0' in metrics
        await asyncio.gather(first, low, high)
        assert done == ["normal", "high", "low"]


async def test_a_low_request_older_than_half_max_wait_s_goes_before_newer_high_ones() -> None:
    async with queued_backend(max_wait_s=3) as (gw, clients):
        done: list[str] = []
        first = ask(clients("sk-normal"), 40, done, "normal")  # holds the slot ~2 s
        services: Services = gw.app.state.services
        await until(
            lambda: services.backends["m"].requests.in_flight == 1, what="the first in flight"
        )
        low = ask(clients("sk-low"), 1, done, "low")
        await until(lambda: queued(gw, 1), what="the low request queued")
        queued_at = time.monotonic()
        await asyncio.sleep(1.6)  # past max_wait_s / 2 = 1.5 s
        assert not first.done()
        high = ask(clients("sk-high"), 1, done, "high")
        await until(lambda: queued(gw, 2), what="the high request queued")
        await asyncio.gather(first, low, high)
        assert done == ["normal", "low", "high"]
        assert time.monotonic() - queued_at < 3  # nobody waited past max_wait_s


async def test_min_resident_s_holds_off_a_swap_while_the_resident_model_serves(
    tmp_path: Path,
) -> None:
    port_a, port_b = free_port(), free_port()
    runtimes = {
        "a": FakeVllmRuntime(port_a, models=["model-a"]),
        "b": FakeVllmRuntime(port_b, models=["model-b"]),
    }
    backends = {  # 20000 + 20000 MiB do not fit on the simulated 32768 MiB GPU
        "a": lazy(port_a, models=["model-a"], vram_mib=20000, priority=10, min_resident_s=1.5),
        "b": lazy(port_b, models=["model-b"], vram_mib=20000, priority=50),
    }
    async with (
        lifecycle_gateway(backends, runtimes, tmp_path, client_keys={"keys": KEYS}) as gw,
        sdk_http(gw) as http,
    ):
        sdk = Clients(http)("sk-normal")
        await sdk.chat.completions.create(model="model-a", messages=HI, max_tokens=2)
        a_ready = time.monotonic()
        b = asyncio.ensure_future(
            sdk.chat.completions.create(model="model-b", messages=HI, max_tokens=2)
        )
        # While b waits for a's residency, a keeps answering.
        served_a = 0
        while time.monotonic() - a_ready < 1.0:
            await sdk.chat.completions.create(model="model-a", messages=HI, max_tokens=2)
            served_a += 1
        assert served_a >= 2
        assert not b.done()
        assert runtimes["b"].starts == 0
        answer = await b
        assert answer.choices
        assert time.monotonic() - a_ready >= 1.5 * 0.9
        assert (await backend_state(gw, "a"))["state"] == "stopped"
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_swaps_total{backend="b",evicted="a"} 1.0' in metrics


async def test_an_idle_backend_sleeps_and_its_next_request_wakes_it(tmp_path: Path) -> None:
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=["lazy-model"], dev_mode=True)}
    backends = {"lazy": lazy(port, idle_ttl_s=0.3, idle={"method": "sleep", "level": 1})}
    async with (
        lifecycle_gateway(backends, runtimes, tmp_path, client_keys={"keys": KEYS}) as gw,
        sdk_http(gw) as http,
    ):
        sdk = Clients(http)("sk-low")
        assert (await sdk.chat.completions.create(model="lazy-model", messages=HI)).choices
        view = await until(
            lambda: _state(gw, "lazy", "sleeping"), what="the idle backend asleep", timeout_s=10
        )
        assert view["reason"].startswith("asleep (level 1, idle")
        assert runtimes["lazy"].stops == 0
        # The next request wakes it (POST /wake_up), it is not started again.
        assert (await sdk.chat.completions.create(model="lazy-model", messages=HI)).choices
        assert (await backend_state(gw, "lazy"))["state"] == "ready"
        assert runtimes["lazy"].starts == 1
        metrics = (await gw.client.get("/metrics")).text
        assert (
            'microscheduler_backend_sleeps_total{backend="lazy",outcome="slept",reason="idle"} 1.0'
            in metrics
        )


async def _state(gw: Gateway, name: str, state: str) -> dict[str, Any] | None:
    view = await backend_state(gw, name)
    return view if view["state"] == state else None
