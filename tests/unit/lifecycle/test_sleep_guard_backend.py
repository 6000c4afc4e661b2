"""The sleep guard in a backend's lifecycle. A fake vLLM whose wake fails: stopped, not
failed, so no restart backoff holds its next start; a pinned one is started again cold by
the watch, a lazy one by its next request. Sleeps measured to free less and less: the one
past `sleep_leak_mib` stops it; a pinned one then stays stopped (its sleep was to free its
memory) until something starts it, cold."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.errors import BackendUnavailable
from app.lifecycle.admission import Claimant, Freed, Unchecked
from app.lifecycle.metrics import LifecycleMetrics as Metrics
from app.lifecycle.state import BackendState, SleepOutcome, StopReason
from tests.fakes.waits import until
from tests.unit.lifecycle.test_backend_lifecycle import LAZY, GatedRuntime, make_backend, state_of

PINNED: dict[str, Any] = {"vram_mib": 1000, "runtime": {"kind": "process", "command": ["x"]}}


class BadWake:
    """A vLLM whose sleep works and whose every wake answers 500, as vLLM answers an
    engine's failed wake_up (app.sim.sleep_mode.WAKE_FAILURE)."""

    def __init__(self) -> None:
        self.sleeping = False
        self.wakes = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/sleep":
            self.sleeping = True
        elif path == "/is_sleeping":
            return httpx.Response(200, json={"is_sleeping": self.sleeping})
        elif path == "/wake_up":
            self.wakes += 1
            error = {"message": "Call to wake_up method failed: CUDA Error: out of memory",
                     "type": "InternalServerError", "param": None, "code": 500}  # fmt: skip
            return httpx.Response(500, json={"error": error})
        return httpx.Response(200)


def trips(metrics: Metrics, cause: str) -> float | None:
    labels = {"backend": "b", "cause": cause}
    return metrics.registry.get_sample_value("microscheduler_sleep_guard_total", labels)


@pytest.mark.parametrize("config", [PINNED, LAZY], ids=["pinned", "lazy"])
async def test_a_failed_wake_stops_it_and_a_cold_start_follows(config: dict[str, Any]) -> None:
    runtime, vllm, metrics = GatedRuntime(), BadWake(), Metrics()
    runtime.gate.set()
    backend = make_backend(runtime, vllm, metrics=metrics, restart_backoff_s=60.0, **config)
    await backend.start()
    assert await backend.sleep(StopReason.ADMIN, level=1) is SleepOutcome.SLEPT
    with pytest.raises(BackendUnavailable) as raised:
        await backend.start()  # the wake answers 500
    assert "wake from sleep failed" in raised.value.message
    assert state_of(backend) is BackendState.STOPPED  # not failed: no 60 s backoff
    assert backend.reason is not None
    assert backend.reason.startswith("sleep guard: wake from sleep failed")
    assert (runtime.stops, vllm.wakes) == (1, 1)
    assert trips(metrics, "wake_failed") == 1.0
    assert backend.memory.holds_vram is False
    stops = {"backend": "b", "reason": "sleep_guard"}
    assert metrics.registry.get_sample_value("microscheduler_backend_stops_total", stops) == 1.0

    if config is PINNED:  # the watch starts it again at once
        assert backend.watcher.restart_in_s == 0.0
        await backend.watcher.watch()
        await until(lambda: state_of(backend) is BackendState.READY, what="the cold start")
    else:  # nothing starts it but a request, which does at once
        assert backend.watcher.restart_in_s is None
        await backend.watcher.watch()
        assert state_of(backend) is BackendState.STOPPED
        await backend.start()
    assert runtime.starts == 2
    assert backend.watcher.restart_in_s is None


class GoodSleep(BadWake):
    """A vLLM whose sleeps and wakes work."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/wake_up":
            self.sleeping = False
            self.wakes += 1
            return httpx.Response(200)
        return super().__call__(request)


class MeasuredSleeps(Unchecked):
    """Admission whose probe saw each sleep free the next of `freed` (MiB)."""

    def __init__(self, *freed: int) -> None:
        self.freed = list(freed)

    @contextlib.asynccontextmanager
    async def measure_sleep(self, backend: Claimant) -> AsyncIterator[Freed]:
        measured = Freed()
        yield measured
        measured.mib = self.freed.pop(0)


async def test_a_pinned_sleeper_that_leaks_is_stopped_and_left_stopped() -> None:
    runtime, vllm, metrics = GatedRuntime(), GoodSleep(), Metrics()
    runtime.gate.set()
    admission = MeasuredSleeps(3500, 3200, 2900, 3500)
    config = {**PINNED, "vram_mib": 4000, "sleep_leak_mib": 512}
    backend = make_backend(runtime, vllm, metrics=metrics, admission=admission, **config)
    await backend.start()
    for held in (500, 800):  # 4000 MiB less what each sleep freed
        assert await backend.sleep(StopReason.ADMIN, level=1) is SleepOutcome.SLEPT
        assert backend.memory.asleep_mib == held
        await backend.start()  # woken
    assert vllm.wakes == 2
    assert await backend.sleep(StopReason.ADMIN, level=1) is SleepOutcome.STOPPED
    assert state_of(backend) is BackendState.STOPPED
    assert backend.reason is not None
    assert backend.reason.startswith("sleep guard: held asleep grew 600 MiB")
    assert trips(metrics, "leak") == 1.0
    record = backend.memory.sleeps.snapshot()
    assert (record.cycles, record.growth_mib) == (3, 600)
    assert record.last_trip is not None
    assert record.last_trip.cause == "leak"

    assert backend.watcher.restart_in_s is None  # not restarted by the watch
    await backend.watcher.watch()
    assert (state_of(backend), runtime.starts) == (BackendState.STOPPED, 1)
    await backend.start()  # a request, or the yield's restore: a cold start
    assert runtime.starts == 2
    assert backend.memory.sleeps.cycles == 0
    assert await backend.sleep(StopReason.ADMIN, level=1) is SleepOutcome.SLEPT
    assert backend.memory.sleeps.snapshot().baseline is not None
