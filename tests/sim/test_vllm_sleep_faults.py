"""The fake vLLM's sleep faults, for the gateway's sleep guard: a leak over sleep/wake
cycles (`--sleep-leak-mib`: each cycle leaves more held asleep, vLLM #21336) and a failing
wake (`--wake-fail-after`: a 500 as vLLM answers an engine's failed wake_up, #48680)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from app.sim.config import FakeConfig
from app.sim.sleep_mode import WAKE_FAILURE
from app.sim.vllm import FakeVllmServer, parse_args


@asynccontextmanager
async def server(**options: Any) -> AsyncIterator[httpx.AsyncClient]:
    config = FakeConfig(port=0, models=["m1"], dev_mode=True, vram_mib=8000, **options)
    async with (
        FakeVllmServer(config) as fake,
        httpx.AsyncClient(base_url=fake.url, timeout=5) as client,
    ):
        yield client


async def held(client: httpx.AsyncClient) -> int:
    value: int = (await client.get("/_fake/stats")).json()["vram_mib"]
    return value


async def test_each_cycle_leaves_more_held_asleep_than_the_last() -> None:
    async with server(vram_asleep_mib=1000, sleep_leak_mib=600) as client:
        asleep = []
        for _ in range(4):
            assert (await client.post("/sleep", params={"level": 1})).status_code == 200
            asleep.append(await held(client))
            assert (await client.post("/wake_up")).status_code == 200
            assert await held(client) == 8000  # awake, the same footprint each time
        assert asleep == [1000, 1600, 2200, 2800]


async def test_the_leak_stops_at_the_awake_footprint() -> None:
    async with server(vram_asleep_mib=7000, sleep_leak_mib=600) as client:
        for expected in (7000, 7600, 8000, 8000):
            await client.post("/sleep", params={"level": 2})
            assert await held(client) == expected
            await client.post("/wake_up")


async def test_without_the_flag_every_sleep_holds_the_same() -> None:
    async with server(vram_asleep_mib=1000) as client:
        for _ in range(3):
            await client.post("/sleep", params={"level": 1})
            assert await held(client) == 1000
            await client.post("/wake_up")


@pytest.mark.parametrize("level", [1, 2])
async def test_a_wake_after_k_cycles_answers_500_as_vllm_and_stays_asleep(level: int) -> None:
    async with server(wake_fail_after=1) as client:
        await client.post("/sleep", params={"level": level})
        assert (await client.post("/wake_up")).status_code == 200  # cycle 1 wakes
        await client.post("/sleep", params={"level": level})
        params = None if level == 1 else {"tags": "weights"}  # the first step of each wake
        failed = await client.post("/wake_up", params=params)
        assert failed.status_code == 500
        assert failed.json() == {
            "error": {
                "message": WAKE_FAILURE,
                "type": "InternalServerError",
                "param": None,
                "code": 500,
            }
        }
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
        assert await held(client) == 1000  # still asleep: its residue (8000 / 8)
        assert (await client.post("/wake_up")).status_code == 500  # and again


async def test_a_wake_of_an_awake_server_does_not_fail() -> None:
    """vLLM's wake_up of an awake engine does nothing; only a real wake fails."""
    async with server(wake_fail_after=0) as client:
        assert (await client.post("/wake_up")).status_code == 200


def test_cli_sleep_fault_flags() -> None:
    default = parse_args([])
    assert (default.sleep_leak_mib, default.wake_fail_after) == (0, None)
    config = parse_args(["--sleep-leak-mib", "512", "--wake-fail-after", "3"])
    assert (config.sleep_leak_mib, config.wake_fail_after) == (512, 3)
    for bad in (["--sleep-leak-mib", "-1"], ["--wake-fail-after", "x"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
