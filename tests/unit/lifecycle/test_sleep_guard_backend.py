"""The sleep guard in a backend's lifecycle, with a fake vLLM whose wake fails: stopped,
not failed, so no restart backoff holds its next start; a pinned one is started again cold
by the watch, a lazy one by its next request."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.errors import BackendUnavailable
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
