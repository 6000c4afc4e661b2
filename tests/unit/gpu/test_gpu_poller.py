"""GpuMonitor over a scripted fake GpuSource (failures, a hang past its timeout, a lost
GPU, recovery), and the simulated GPU as a source."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

import pytest

from app.api.views import gpu_status_view
from app.gpu.poller import GpuMonitor
from app.gpu.sim import SimSource
from app.gpu.telemetry import MIB, GpuProcess, GpuSnapshot, GpuSource, GpuStats, ProbeError
from tests.fakes.waits import until

GIB = 1024 * MIB
HANG_TIMEOUT_S = 0.05


def gpu(index: int, used_gib: int = 4, *, lost: bool = False) -> GpuStats:
    return GpuStats(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA L4",
        total_bytes=24 * GIB,
        used_bytes=used_gib * GIB,
        free_bytes=(24 - used_gib) * GIB,
        reserved_bytes=300 * MIB,
        utilization_gpu_pct=50.0,
        temperature_c=61.0,
        power_w=70.5,
        processes=(GpuProcess(1234, 3 * GIB + 1),),
        lost=lost,
        error="GPU 1 is lost" if lost else None,
    )


class FakeSource:
    """Answers with `gpus`, or raises `fail`; with `gate` set it waits on it and, past
    `HANG_TIMEOUT_S`, raises a timeout as a real source bounded by a timeout does."""

    name = "fake"

    def __init__(self, *gpus: GpuStats) -> None:
        self.gpus = gpus
        self.fail: BaseException | None = None
        self.gate: asyncio.Event | None = None
        self.age_s = 0.0  # how old each sample is when taken
        self.calls = 0
        self.closed = False
        self.called = asyncio.Event()

    async def sample(self) -> GpuSnapshot:
        self.calls += 1
        self.called.set()
        snapshot = GpuSnapshot(
            source=self.name,
            gpus=self.gpus,
            taken_at=time.monotonic() - self.age_s,
            taken_at_wall=time.time() - self.age_s,
            driver_version="550.54.15",
        )
        if self.gate is not None:
            try:
                await asyncio.wait_for(self.gate.wait(), HANG_TIMEOUT_S)
            except TimeoutError:
                raise ProbeError("NVML did not answer within 0.05 s", reason="timeout") from None
        if self.fail is not None:
            raise self.fail
        return snapshot

    async def close(self) -> None:
        self.closed = True


def monitor_of(source: GpuSource, *, stale_after_s: float = 10.0) -> GpuMonitor:
    return GpuMonitor(source, poll_interval_s=0.001, stale_after_s=stale_after_s)


async def test_read_takes_a_fresh_sample_and_reports_mib() -> None:
    source = FakeSource(gpu(0, 4), gpu(1, 10))
    monitor = monitor_of(source)

    reading = await monitor.read()
    await monitor.read()

    assert source.calls == 2  # fresh each time: the arbiter polls for freed memory
    assert reading is not None
    assert [(g.index, g.total_mib, g.used_mib) for g in reading.gpus] == [
        (0, 24576, 4096),
        (1, 24576, 10240),
    ]
    assert monitor.name == "fake"
    assert monitor.up
    assert (monitor.error, monitor.reason, monitor.consecutive_failures) == (None, None, 0)
    assert monitor.snapshot is not None
    assert reading.taken_at <= monitor.snapshot.taken_at


async def test_status_is_the_status_section() -> None:
    monitor = monitor_of(FakeSource(gpu(0, 4)))
    await monitor.read()

    status = gpu_status_view(monitor.status())

    assert status["source"] == "fake"
    assert (status["up"], status["error"], status["reason"], status["stale"]) == (
        True,
        None,
        None,
        False,
    )
    assert status["driver_version"] == "550.54.15"
    assert 0 <= status["age_s"] < 5
    assert status["gpus"] == [
        {
            "index": 0,
            "uuid": "GPU-0",
            "name": "NVIDIA L4",
            "total_mib": 24576,
            "used_mib": 4096,
            "free_mib": 20480,
            "reserved_mib": 300,
            "utilization_gpu_pct": 50.0,
            "utilization_memory_pct": None,
            "temperature_c": 61.0,
            "power_w": 70.5,
            "lost": False,
            "error": None,
            "processes": [{"pid": 1234, "used_mib": 3073}],  # rounded up
        }
    ]


async def test_failure_without_any_snapshot_turns_admission_off() -> None:
    source = FakeSource(gpu(0))
    source.fail = ProbeError("libnvidia-ml.so.1 not found", reason="library_not_found")
    monitor = monitor_of(source)

    assert await monitor.read() is None

    assert not monitor.up
    assert monitor.error == "libnvidia-ml.so.1 not found"
    assert monitor.reason == "library_not_found"
    assert monitor.consecutive_failures == 1
    assert monitor.snapshot is None
    assert monitor.age_s() is None
    assert monitor.stale
    assert monitor.last_success_wall is None
    assert gpu_status_view(monitor.status())["gpus"] == []


async def test_failure_after_success_serves_the_last_good_snapshot() -> None:
    source = FakeSource(gpu(0, 4))
    monitor = monitor_of(source)
    good = await monitor.read()
    snapshot = monitor.snapshot
    source.fail = ProbeError("GPU driver gone", reason="driver_not_loaded")

    first = await monitor.read()
    second = await monitor.read()

    assert first == good
    assert second == good
    assert monitor.snapshot is snapshot
    assert not monitor.up
    assert monitor.consecutive_failures == 2
    assert gpu_status_view(monitor.status())["reason"] == "driver_not_loaded"
    assert gpu_status_view(monitor.status())["gpus"][0]["used_mib"] == 4096

    source.fail = None
    await monitor.read()
    assert monitor.up
    assert monitor.consecutive_failures == 0
    assert monitor.error is None


async def test_a_hung_source_times_out_and_recovers() -> None:
    source = FakeSource(gpu(0, 4))
    monitor = monitor_of(source)
    await monitor.read()
    source.gpus = (gpu(0, 12),)
    source.gate = asyncio.Event()  # never released: the sample hangs past its timeout

    reading = await monitor.read()

    assert reading is not None
    assert reading.gpus[0].used_mib == 4096  # the last good one
    assert (monitor.up, monitor.reason) == (False, "timeout")

    source.gate.set()
    reading = await monitor.read()

    assert reading is not None
    assert reading.gpus[0].used_mib == 12288
    assert monitor.up


async def test_a_lost_gpu_is_left_out_of_admission_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = FakeSource(gpu(0), gpu(1))
    monitor = monitor_of(source)
    await monitor.read()
    source.gpus = (gpu(0), gpu(1, lost=True))

    with caplog.at_level(logging.INFO, logger="app.gpu.poller"):
        reading = await monitor.read()
        await monitor.read()
        await monitor.read()
        source.gpus = (gpu(0), gpu(1))
        back = await monitor.read()

    assert reading is not None
    assert reading.usable_indices == [0]
    assert back is not None
    assert back.usable_indices == [0, 1]
    lost_logs = [r for r in caplog.records if r.getMessage().startswith("gpu lost")]
    assert len(lost_logs) == 1
    assert lost_logs[0].levelno == logging.ERROR
    assert "gpu=1" in lost_logs[0].getMessage()
    assert sum(r.getMessage().startswith("gpu back host=local gpu=1") for r in caplog.records) == 1


async def test_lost_gpu_in_status() -> None:
    monitor = monitor_of(FakeSource(gpu(0), gpu(1, lost=True)))
    await monitor.read()

    status = gpu_status_view(monitor.status())

    assert monitor.up  # the sample worked; one GPU is lost
    assert [(g["index"], g["lost"], g["error"]) for g in status["gpus"]] == [
        (0, False, None),
        (1, True, "GPU 1 is lost"),
    ]


async def test_transitions_are_logged_once_not_every_poll(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = FakeSource(gpu(0))
    monitor = monitor_of(source)

    with caplog.at_level(logging.INFO, logger="app.gpu.poller"):
        await monitor.read()
        source.fail = ProbeError("driver gone", reason="driver_not_loaded")
        for _ in range(3):
            await monitor.read()
        source.fail = ProbeError("no permission", reason="no_permission")
        for _ in range(3):
            await monitor.read()
        source.fail = None
        for _ in range(3):
            await monitor.read()

    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(" host=local source=")[0] for m in messages] == [
        "gpu probe up",
        "gpu probe down",  # driver_not_loaded
        "gpu probe down",  # a different reason
        "gpu probe up",
    ]
    assert "reason=no_permission" in messages[2]
    assert "after_failures=6" in messages[3]


async def test_snapshots_are_immutable_and_replaced_not_changed() -> None:
    source = FakeSource(gpu(0, 4))
    monitor = monitor_of(source)
    await monitor.read()
    held = monitor.snapshot
    assert held is not None

    source.gpus = (gpu(0, 20),)
    await monitor.read()

    assert held.gpus[0].used_bytes == 4 * GIB
    assert monitor.snapshot is not held
    assert monitor.snapshot is not None
    assert monitor.snapshot.gpus[0].used_bytes == 20 * GIB
    with pytest.raises(dataclasses.FrozenInstanceError):
        held.gpus[0].used_bytes = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        held.taken_at = 0.0  # type: ignore[misc]


class GatedSource:
    """Each call takes its snapshot at once, then answers when its own gate opens."""

    name = "gated"

    def __init__(self) -> None:
        self.gates: list[asyncio.Event] = []
        self.used_gib = 4
        self.called = asyncio.Event()

    async def sample(self) -> GpuSnapshot:
        snapshot = GpuSnapshot(self.name, (gpu(0, self.used_gib),), time.monotonic(), time.time())
        gate = asyncio.Event()
        self.gates.append(gate)
        self.called.set()
        await gate.wait()
        return snapshot

    async def close(self) -> None:
        return None


async def test_a_slow_older_sample_does_not_replace_a_newer_one() -> None:
    source = GatedSource()
    monitor = monitor_of(source)
    slow = asyncio.create_task(monitor.read())  # taken first (4 GiB), answers last
    await source.called.wait()
    source.used_gib = 9
    fast = asyncio.create_task(monitor.read())
    await until(lambda: len(source.gates) == 2, what="the second read to reach the source")
    source.gates[1].set()
    await fast
    source.gates[0].set()
    await slow

    assert monitor.snapshot is not None
    assert monitor.snapshot.gpus[0].used_bytes == 9 * GIB


async def test_age_and_stale() -> None:
    source = FakeSource(gpu(0))
    monitor = monitor_of(source, stale_after_s=10.0)
    assert monitor.stale  # never sampled

    source.age_s = 30.0
    await monitor.read()
    age = monitor.age_s()
    assert age is not None
    assert age >= 30.0
    assert monitor.stale
    assert gpu_status_view(monitor.status())["stale"] is True

    source.age_s = 0.0
    await monitor.read()
    age = monitor.age_s()
    assert age is not None
    assert age < 10.0
    assert not monitor.stale
    assert monitor.last_success_wall == pytest.approx(time.time(), abs=5)


class ScriptedSource:
    """Answers each call from a script (an exception to raise, or stats to return),
    then keeps answering with the last entry; `reached` is set at call `wait_for`."""

    name = "scripted"

    def __init__(self, script: list[BaseException | GpuStats], wait_for: int) -> None:
        self.script = script
        self.calls = 0
        self.wait_for = wait_for
        self.reached = asyncio.Event()

    async def sample(self) -> GpuSnapshot:
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if self.calls >= self.wait_for:
            self.reached.set()
        if isinstance(step, BaseException):
            raise step
        return GpuSnapshot(self.name, (step,), time.monotonic(), time.time())

    async def close(self) -> None:
        return None


async def test_run_keeps_polling_through_failures() -> None:
    source = ScriptedSource(
        [
            ProbeError("timed out", reason="timeout"),
            RuntimeError("a bug in the source"),  # not a ProbeError: must not kill the loop
            ProbeError("driver gone", reason="driver_not_loaded"),
            gpu(0, 6),
        ],
        wait_for=6,
    )
    monitor = GpuMonitor(source, poll_interval_s=0.001, stale_after_s=10)
    task = asyncio.create_task(monitor.run())
    try:
        await asyncio.wait_for(source.reached.wait(), 5)
        assert not task.done()
    finally:
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert monitor.up
    assert monitor.snapshot is not None
    assert monitor.snapshot.gpus[0].used_bytes == 6 * GIB


async def test_unexpected_source_error_is_recorded() -> None:
    source = ScriptedSource([RuntimeError("boom")], wait_for=1)
    monitor = monitor_of(source)

    assert await monitor.read() is None

    assert monitor.reason == "error"
    assert monitor.error is not None
    assert "boom" in monitor.error


async def test_close_closes_the_source() -> None:
    source = FakeSource(gpu(0))
    monitor = monitor_of(source)

    await monitor.close()

    assert source.closed


# -- the simulated GPU as a source -----------------------------------------------------


async def test_sim_source_reports_placed_memory_clamped() -> None:
    placed: dict[int, int] = {0: 6000, 1: 99999}
    source = SimSource(24000, 3, lambda: placed)

    snapshot = await source.sample()

    assert source.name == "sim"
    assert snapshot.source == "sim"
    assert [(g.index, g.uuid, g.name) for g in snapshot.gpus] == [
        (0, "GPU-sim-0", "Simulated GPU"),
        (1, "GPU-sim-1", "Simulated GPU"),
        (2, "GPU-sim-2", "Simulated GPU"),
    ]
    assert [(g.total_mib, g.used_mib, g.free_mib) for g in snapshot.gpus] == [
        (24000, 6000, 18000),
        (24000, 24000, 0),
        (24000, 0, 24000),
    ]
    stats = snapshot.gpus[0]
    assert stats.reserved_bytes is None
    assert stats.utilization_gpu_pct is None
    assert stats.temperature_c is None
    assert stats.power_w is None
    assert stats.processes == ()
    await source.close()


async def test_monitor_over_sim_reports_placed_memory_as_used() -> None:
    placed: dict[int, int] = {0: 7000}
    used: Callable[[], dict[int, int]] = lambda: placed  # noqa: E731
    monitor = monitor_of(SimSource(24000, 2, used))

    reading = await monitor.read()

    assert reading is not None
    assert [(g.index, g.total_mib, g.used_mib, g.free_mib) for g in reading.gpus] == [
        (0, 24000, 7000, 17000),
        (1, 24000, 0, 24000),
    ]
