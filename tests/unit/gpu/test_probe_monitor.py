"""`ProbeMonitor`: the host RAM's monitor keeps its probe's health as the GPU's does (one
piece of logic for both): the reason it is down and for how many samples, a log line per
transition or new reason, and never an older reading over a newer one."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from app.gpu.host_ram import KIB, HostRamMonitor, RamReading
from app.gpu.telemetry import ProbeError

MIB = KIB * KIB


class RamSource:
    """Answers `available_mib` of 64 GiB, or raises `fail`; with `gated` each sample
    waits for its own gate (`gates`, in the order the samples were asked)."""

    name = "fake"

    def __init__(self) -> None:
        self.available_mib = 40000
        self.fail: BaseException | None = None
        self.gated = False
        self.gates: list[asyncio.Event] = []
        self.asked = asyncio.Event()

    async def sample(self) -> RamReading:
        reading = RamReading(65536 * MIB, self.available_mib * MIB, time.monotonic())
        if self.gated:
            gate = asyncio.Event()
            self.gates.append(gate)
            self.asked.set()
            await gate.wait()
        if self.fail is not None:
            raise self.fail
        return reading


async def test_the_host_ram_monitor_keeps_why_its_probe_is_down_and_for_how_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = RamSource()
    monitor = HostRamMonitor(source, host="node-b", poll_interval_s=1.0)
    with caplog.at_level(logging.INFO, logger="app.gpu.host_ram"):
        await monitor.read()
        source.fail = ProbeError("Prometheus at http://p:9090 timed out", reason="timeout")
        for _ in range(3):
            await monitor.read()
        assert (monitor.up, monitor.reason, monitor.consecutive_failures) == (False, "timeout", 3)
        source.fail = ProbeError("Prometheus at http://p:9090 has no sample", reason="no_data")
        for _ in range(2):
            await monitor.read()
        assert (monitor.reason, monitor.consecutive_failures) == ("no_data", 5)
        source.fail = None
        await monitor.read()
    assert (monitor.up, monitor.reason, monitor.error, monitor.consecutive_failures) == (
        True, None, None, 0,
    )  # fmt: skip
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(" host=node-b source=fake")[0] for m in messages] == [
        "host ram probe up",
        "host ram probe down",  # timeout, once for three
        "host ram probe down",  # a new reason
        "host ram probe up",
    ]
    assert "total_mib=65536 available_mib=40000" in messages[0]
    assert "reason=no_data" in messages[2]
    assert "after_failures=5" in messages[3]


async def test_a_slow_older_ram_reading_does_not_replace_a_newer_one() -> None:
    source = RamSource()
    source.gated = True
    monitor = HostRamMonitor(source, host="local", poll_interval_s=1.0)
    slow = asyncio.create_task(monitor.read())  # taken first (40,000 MiB), answers last
    await source.asked.wait()
    source.available_mib = 1000
    fast = asyncio.create_task(monitor.read())
    while len(source.gates) < 2:
        source.asked.clear()
        await source.asked.wait()
    source.gates[1].set()
    assert (await fast) is not None
    source.gates[0].set()
    await slow
    assert monitor.reading is not None
    assert monitor.reading.available_mib == 1000
