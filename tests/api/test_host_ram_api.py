"""Host RAM as a resource, through the gateway in process: level-1 sleepers are charged
their weights against the host RAM budget, the least recently used one is stopped to make
room, a yield takes the same choice, and /status and /metrics show the numbers.

Two lazy fake vLLM servers with sleep mode (1000 MiB each, charged by `vram_mib`), idle
after 0.2 s (`idle: auto`, the default), on a sim GPU large enough for both; the host's
RAM is a fixed reading (64 GiB, 40 GiB available).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.gpu.host_ram import RamReading
from app.runtimes.base import Runtime
from app.services import Seams
from app.settings import BackendConfig
from tests.fakes.processes import free_port
from tests.fakes.prometheus import dcgm_gpu, fake_prometheus, node_memory
from tests.fakes.servers import (
    FakeVllmRuntime,
    Gateway,
    chat,
    gateway,
    gateway_settings,
    settle_yields_quickly,
    until_backend,
)
from tests.fakes.waits import until

GIB = 1024**3
MIB = 1024**2


class FixedRam:
    """The host's RAM as a fixed reading (the local host's `RamSource`)."""

    name = "meminfo"

    def __init__(self, total_mib: int, available_mib: int) -> None:
        self.total_mib, self.available_mib = total_mib, available_mib

    async def sample(self) -> RamReading:
        return RamReading(self.total_mib * MIB, self.available_mib * MIB, time.monotonic())


@asynccontextmanager
async def two_sleepers(
    tmp_path: Path, host_ram: dict[str, Any], **fields: Any
) -> AsyncIterator[tuple[Gateway, dict[str, FakeVllmRuntime]]]:
    ports = {"a": free_port(), "b": free_port()}
    runtimes = {
        name: FakeVllmRuntime(port, models=[f"{name}-model"], vram_mib=1000, dev_mode=True)
        for name, port in ports.items()
    }
    backends = {
        name: {
            "url": f"http://127.0.0.1:{port}",
            "models": [f"{name}-model"],
            "runtime": {"kind": "process", "command": ["unused: the test's runtime runs it"]},
            "lifecycle": "lazy",
            "vram_mib": 1000,
            "idle_ttl_s": 0.2,
            "sleep_mode": True,
            **fields,
        }
        for name, port in ports.items()
    }

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtimes[name]

    settings = gateway_settings(
        backends,
        state_dir=tmp_path,
        gpu={"probe": "sim", "poll_interval_s": 0.05, "sim": {"total_mib": 32768}},
        reaper_interval_s=0.05,
        host_ram={"poll_interval_s": 0.05, **host_ram},
    )
    seams = Seams(runtime_factory=runtime_for, ram_source=FixedRam(65536, 40960))
    async with gateway(settings, seams=seams) as gw:
        yield gw, runtimes


async def served(gw: Gateway, model: str) -> None:
    response = await gw.client.post("/v1/chat/completions", json=chat(model, max_tokens=2))
    assert response.status_code == 200, response.text


async def releases(gw: Gateway) -> list[dict[str, Any]]:
    events = (await gw.client.get("/status")).json()["events"]
    return [e for e in events if e["kind"] == "release"]


def sample(text: str, name: str, labels: dict[str, str]) -> float | None:
    for family in text_string_to_metric_families(text):
        for one in family.samples:
            if one.name == name and one.labels == labels:
                return float(one.value)
    return None


async def test_two_sleepers_over_the_budget_stop_the_least_recently_used(tmp_path: Path) -> None:
    async with two_sleepers(tmp_path, {"sleep_budget_mib": 1500, "reserve_mib": 4096}) as (
        gw,
        runtimes,
    ):
        await served(gw, "a-model")
        view = await until_backend(gw, "a", state="sleeping")
        assert view["asleep_level"] == 1
        assert view["host_ram_charge_mib"] == 1000
        assert view["host_ram_charge_from"] == "vram_mib"
        (first,) = await releases(gw)
        assert first["backend"] == "a"
        assert first["cause"] == "idle"
        assert (first["method"], first["level"]) == ("sleep", 1)
        assert first["reason"] == "sleep level 1: fits the host RAM budget (1,000 of 1,500 MiB)"

        await served(gw, "b-model")  # used after a: a is the least recently used
        await until_backend(gw, "b", state="sleeping")
        view = await until_backend(gw, "a", state="stopped")
        assert "host_ram" in view["reason"]
        assert runtimes["a"].stops == 1
        b_choice, a_stop = (await releases(gw))[1:]
        assert b_choice["backend"] == "b"
        assert b_choice["level"] == 1
        assert b_choice["make_room"] == ["a"]
        assert b_choice["reason"] == (
            "sleep level 1: fits the host RAM budget (1,000 of 1,500 MiB) after stopping the "
            "least recently used level-1 sleeper(s) a"
        )
        assert a_stop["backend"] == "a"
        assert a_stop["cause"] == "host_ram"
        assert a_stop["method"] == "stop"
        assert a_stop["reason"] == (
            "stop: host RAM budget full, least recently used level-1 sleeper (room for b)"
        )

        status = (await gw.client.get("/status")).json()
        ram = status["host_ram"]
        assert ram == status["hosts"][0]["host_ram"]
        assert (ram["probe"], ram["up"], ram["total_mib"], ram["available_mib"]) == (
            "meminfo",
            True,
            65536,
            40960,
        )
        assert (ram["budget_mib"], ram["budget_from"], ram["reserve_mib"]) == (
            1500,
            "sleep_budget_mib",
            4096,
        )
        assert (ram["charged_mib"], ram["free_budget_mib"]) == (1000, 500)
        assert ram["sleepers"] == [
            {"backend": "b", "charged_mib": 1000, "in_use_mib": 1000, "charged_from": "vram_mib",
             "pending": False}
        ]  # fmt: skip
        # The bar's parts, from the same reading: they add up to the machine's RAM.
        assert (ram["used_mib"], ram["other_mib"]) == (65536 - 40960, 65536 - 40960 - 1000)

        metrics = (await gw.client.get("/metrics")).text
        local = {"host": "local"}
        assert sample(metrics, "microscheduler_host_ram_total_bytes", local) == 65536 * MIB
        assert sample(metrics, "microscheduler_host_ram_available_bytes", local) == 40960 * MIB
        assert sample(metrics, "microscheduler_host_ram_sleep_budget_bytes", local) == 1500 * MIB
        assert sample(metrics, "microscheduler_host_ram_reserve_bytes", local) == 4096 * MIB
        assert sample(metrics, "microscheduler_host_ram_sleep_charged_bytes", local) == 1000 * MIB
        assert sample(metrics, "microscheduler_host_ram_sleepers", local) == 1.0
        assert sample(metrics, "microscheduler_host_ram_probe_up", local) == 1.0
        stops = {"backend": "a", "reason": "host_ram"}
        assert sample(metrics, "microscheduler_backend_stops_total", stops) == 1.0


async def test_the_default_budget_is_half_of_mem_total(tmp_path: Path) -> None:
    async with two_sleepers(tmp_path, {}) as (gw, _):
        await served(gw, "a-model")
        await until_backend(gw, "a", state="sleeping", asleep_level=1)
        ram = (await gw.client.get("/status")).json()["host_ram"]
        assert (ram["budget_mib"], ram["budget_from"]) == (32768, "50% of MemTotal")
        assert ram["charged_mib"] == 1000


async def test_weights_over_the_budget_sleep_at_level_2_or_stop(tmp_path: Path) -> None:
    # auto (deepest level 2): level 2; auto capped at level 1: stopped.
    async with two_sleepers(
        tmp_path, {"sleep_budget_mib": 500}, idle={"method": "auto", "level": 1}
    ) as (gw, runtimes):
        await served(gw, "a-model")
        await until_backend(gw, "a", state="stopped")
        (choice,) = await releases(gw)
        assert (choice["method"], choice["level"]) == ("stop", None)
        assert choice["reason"] == (
            "stop: weights (1,000 MiB) exceed the host RAM budget (500 MiB)"
        )
        assert runtimes["a"].stops == 1
    async with two_sleepers(tmp_path, {"sleep_budget_mib": 500}) as (gw, _):
        await served(gw, "a-model")
        view = await until_backend(gw, "a", state="sleeping")
        assert view["asleep_level"] == 2
        (choice,) = await releases(gw)
        assert choice["reason"].startswith("sleep level 2: weights (1,000 MiB) exceed")
        assert (await gw.client.get("/status")).json()["host_ram"]["charged_mib"] == 0


async def test_a_yield_takes_the_same_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settle_yields_quickly(monkeypatch)
    async with two_sleepers(
        tmp_path, {"sleep_budget_mib": 500}, idle_ttl_s=0, **{"yield": {"level": 1}}
    ) as (gw, runtimes):
        await served(gw, "a-model")
        await until_backend(gw, "a", state="ready")
        body = (await gw.client.post("/vram/yield", json={"reason": "gaming"})).json()
        assert body["stopped"] == ["a"]
        (choice,) = await releases(gw)
        assert (choice["backend"], choice["cause"]) == ("a", "yield")
        assert choice["reason"] == (
            "stop: weights (1,000 MiB) exceed the host RAM budget (500 MiB)"
        )
        assert runtimes["a"].stops == 1
        await gw.client.post("/vram/restore")
    async with two_sleepers(tmp_path, {"sleep_budget_mib": 1500}, idle_ttl_s=0) as (gw, _):
        await served(gw, "a-model")
        await until_backend(gw, "a", state="ready")
        body = (await gw.client.post("/vram/yield", json={"reason": "gaming"})).json()
        assert body["slept"] == ["a"]
        await until(
            lambda: _asleep_at(gw, "a", 1), what=lambda: "a asleep at level 1 after the yield"
        )
        (choice,) = await releases(gw)
        assert choice["reason"] == "sleep level 1: fits the host RAM budget (1,000 of 1,500 MiB)"


async def _asleep_at(gw: Gateway, name: str, level: int) -> bool:
    views = (await gw.client.get("/backends")).json()["backends"]
    return any(v["name"] == name and v["asleep_level"] == level for v in views)


async def test_another_hosts_ram_is_read_from_node_exporter(tmp_path: Path) -> None:
    series = [
        *dcgm_gpu(0),
        *node_memory(host="node-c", total_bytes=128 * GIB, available_bytes=96 * GIB),
        *node_memory(host="node-d", total_bytes=64 * GIB, available_bytes=1 * GIB),
    ]
    async with fake_prometheus(*series) as prometheus:
        settings = gateway_settings(
            {"b": {"url": "http://127.0.0.1:9", "models": ["m"], "host": "node-c"}},
            state_dir=tmp_path,
            host_ram={"sleep_budget_mib": 2048},  # the local host's; node-c's is its own
            hosts={
                "node-c": {
                    "gpu": {
                        "probe": "prometheus",
                        "poll_interval_s": 0.05,
                        "prometheus": {"url": prometheus.url, "query_interval_s": 0},
                    },
                    "host_ram": {"selector": '{instance="node-c:9100"}', "poll_interval_s": 0.05},
                }
            },
        )
        async with gateway(settings) as gw:

            async def node_c() -> dict[str, Any] | None:
                hosts = (await gw.client.get("/status")).json()["hosts"]
                ram: dict[str, Any] = next(h for h in hosts if h["name"] == "node-c")["host_ram"]
                return ram if ram["up"] else None

            ram = await until(node_c, what="node-c's RAM read")
            metrics = (await gw.client.get("/metrics")).text
    assert (ram["probe"], ram["total_mib"], ram["available_mib"]) == (
        "prometheus",
        128 * 1024,
        96 * 1024,
    )
    assert (ram["budget_mib"], ram["budget_from"]) == (64 * 1024, "50% of MemTotal")
    assert (ram["charged_mib"], ram["sleepers"]) == (0, [])
    node = {"host": "node-c"}
    assert sample(metrics, "microscheduler_host_ram_total_bytes", node) == 128 * GIB
    assert sample(metrics, "microscheduler_host_ram_available_bytes", node) == 96 * GIB
    assert any("node_memory_MemAvailable_bytes" in q for q in prometheus.queries)
