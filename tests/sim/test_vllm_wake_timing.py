"""The fake vLLM's modelled wake ("Swap in seconds" item 5): with `--wake-gib-per-s` a
level-1 `/wake_up` takes the weights' size over that bandwidth (the size from
`--weights-mib`, else what a sleep frees), a level-2 `reload_weights` the same; the stats
report every wake and its seconds, so a benchmark can tell the fake's modelled time from
the gateway's."""

from __future__ import annotations

import time

import httpx
import pytest

from app.sim.config import FakeConfig
from app.sim.vllm import parse_args
from tests.fakes.servers import fake_vllm


async def stats(client: httpx.AsyncClient) -> dict[str, object]:
    body: dict[str, object] = (await client.get("/_fake/stats")).json()
    return body


def test_the_weights_size_is_derived_from_the_footprint_or_given() -> None:
    derived = FakeConfig(vram_mib=8192, vram_asleep_mib=1024, wake_gib_per_s=7.0)
    assert derived.wake_s() == pytest.approx(1.0)  # 7 GiB freed by a sleep, at 7 GiB/s
    assert FakeConfig(vram_mib=8192, wake_gib_per_s=7.0).wake_s() == pytest.approx(1.0)
    given = FakeConfig(vram_mib=8192, weights_mib=2048, wake_gib_per_s=4.0)
    assert given.wake_s() == pytest.approx(0.5)
    assert FakeConfig(vram_mib=8192).wake_s() == 0.0  # not modelled: instant


def test_the_options_parse_like_vllm_flags() -> None:
    config = parse_args(
        ["--vram-mib", "4096", "--wake-gib-per-s", "8", "--weights-mib", "1024",
         "--enable-sleep-mode"]
    )  # fmt: skip
    assert config.wake_gib_per_s == 8.0
    assert config.weights_mib == 1024
    assert config.enable_sleep_mode is True


async def test_a_level_1_wake_takes_the_modelled_time_and_reports_it() -> None:
    options = {"dev_mode": True, "vram_mib": 1024, "weights_mib": 512, "wake_gib_per_s": 2.5}
    async with fake_vllm(**options) as server:
        client = server.client
        assert (await client.post("/sleep", params={"level": 1})).status_code == 200
        began = time.monotonic()
        assert (await client.post("/wake_up")).status_code == 200
        assert time.monotonic() - began >= 0.2  # 0.5 GiB at 2.5 GiB/s
        seen = await stats(client)
        assert seen["wakes"] == 1
        assert seen["wake_s"] == pytest.approx(0.2)
        assert seen["startup_delay_s"] == 0.0
        assert isinstance(seen["pid"], int)


async def test_a_level_2_wake_takes_it_in_the_weights_reload() -> None:
    options = {"dev_mode": True, "vram_mib": 1024, "weights_mib": 512, "wake_gib_per_s": 2.5}
    async with fake_vllm(**options) as server:
        client = server.client
        assert (await client.post("/sleep", params={"level": 2})).status_code == 200
        began = time.monotonic()
        await client.post("/wake_up", params={"tags": "weights"})
        assert time.monotonic() - began < 0.2  # memory back, contents not yet
        reload = await client.post("/collective_rpc", json={"method": "reload_weights"})
        assert reload.status_code == 200
        await client.post("/wake_up", params={"tags": "kv_cache"})
        assert time.monotonic() - began >= 0.2
        assert (await stats(client))["wakes"] == 1
