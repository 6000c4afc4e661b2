"""No load nobody waits for (issue 36, point 2): a lazy start begun only for held requests
is cancelled through the stop path when the last of them leaves before it is ready,
after `start_cancel_grace_s`; every other start is kept. A Backend with a gated fake
runtime: no processes, no sleeps as synchronisation."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.errors import BackendUnavailable, WakeTimeout
from app.events import EventLog
from app.lifecycle.backend import Backend
from app.lifecycle.metrics import LifecycleMetrics as Metrics
from app.lifecycle.state import BackendState
from app.settings import BackendConfig, TimeoutsConfig
from app.upstreams.http import HttpUpstream
from app.upstreams.vllm import VllmClient
from tests.fakes.waits import until
from tests.unit.lifecycle.test_backend_lifecycle import LAZY, GatedRuntime, healthy, state_of


class Rig:
    """One backend (`lazy` unless told) with its events and metrics."""

    def __init__(self, *, grace_s: float = 0.0, **config: Any) -> None:
        self.runtime = GatedRuntime()
        self.events = EventLog()
        self.metrics = Metrics()
        fields = {**LAZY, **config}
        cfg = BackendConfig(url="http://backend:8000", models=["m"], **fields)
        self.client = httpx.AsyncClient(transport=httpx.MockTransport(healthy))
        self.backend = Backend(
            "b",
            cfg,
            self.runtime,
            HttpUpstream("b", cfg.url, TimeoutsConfig()),
            VllmClient(self.client, cfg.url),
            self.metrics,
            events=self.events,
            start_cancel_grace_s=grace_s,
        )

    def held(self, **kwargs: Any) -> asyncio.Task[Any]:
        """A request held for the backend (it starts it if it is stopped)."""
        return asyncio.create_task(self.backend.requests.acquire(**kwargs))

    async def leave(self, task: asyncio.Task[Any]) -> None:
        """Its client goes away."""
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    def cancelled(self) -> list[dict[str, Any]]:
        return [e for e in self.events.recent() if e["kind"] == "start_cancelled"]

    def counted(self) -> float | None:
        return self.metrics.registry.get_sample_value(
            "microscheduler_start_cancelled_total", {"backend": "b"}
        )

    async def close(self) -> None:
        await self.backend.abandon()
        await self.client.aclose()


@pytest.fixture
async def rig() -> Any:
    made: list[Rig] = []

    def make(**kwargs: Any) -> Rig:
        made.append(Rig(**kwargs))
        return made[-1]

    yield make
    for one in made:
        await one.close()


async def test_a_lazy_start_whose_only_request_left_is_stopped(rig: Any) -> None:
    r: Rig = rig()
    request = r.held()
    await until(lambda: r.runtime.starts == 1, what="the runtime asked to start")
    await r.leave(request)
    await until(lambda: state_of(r.backend) is BackendState.STOPPED, what="the start cancelled")
    assert r.runtime.stops == 1  # the server being launched was stopped
    assert r.runtime.running is False
    assert r.backend.memory.holds_vram is False  # its claim given back
    assert r.backend.reason == "stopped by the gateway (unwanted)"
    [event] = r.cancelled()
    assert event["backend"] == "b"
    assert event["phase"] == "launching"
    assert event["waiters"] == 0
    assert event["seconds"] >= 0
    assert r.counted() == 1
    assert (
        r.metrics.registry.get_sample_value(
            "microscheduler_backend_starts_total", {"backend": "b", "outcome": "cancelled"}
        )
        == 1
    )


async def test_a_request_that_times_out_at_the_backends_max_wait_s_cancels_it(rig: Any) -> None:
    r: Rig = rig(max_wait_s=0.05)
    with pytest.raises(WakeTimeout):
        await r.backend.requests.acquire()
    await until(lambda: state_of(r.backend) is BackendState.STOPPED, what="the start cancelled")
    assert r.runtime.stops == 1
    assert r.counted() == 1


async def test_the_start_goes_on_while_another_request_still_waits(rig: Any) -> None:
    r: Rig = rig()
    first, second = r.held(), r.held()
    await until(lambda: r.backend.requests.waiting == 2, what="both requests held")
    await r.leave(first)
    r.runtime.gate.set()
    (await second).release()
    assert state_of(r.backend) is BackendState.READY
    assert r.cancelled() == []


async def test_a_request_arriving_within_the_grace_keeps_the_start(rig: Any) -> None:
    r: Rig = rig(grace_s=0.2)
    await r.leave(await _started(r))
    retry = r.held()  # the client retries at once
    await until(lambda: r.backend.requests.waiting == 1, what="the retry held")
    # Past the grace: the timer found someone waiting and kept the start.
    timer = r.backend.want.grace
    assert timer is not None
    await asyncio.wait({timer})
    assert state_of(r.backend) is BackendState.STARTING
    r.runtime.gate.set()
    (await retry).release()
    assert r.runtime.starts == 1
    assert r.runtime.stops == 0
    assert r.cancelled() == []


async def test_the_grace_delays_the_cancel(rig: Any) -> None:
    r: Rig = rig(grace_s=0.2)
    await r.leave(await _started(r))
    loop = asyncio.get_running_loop()
    left = loop.time()
    await until(lambda: state_of(r.backend) is BackendState.STOPPED, what="the start cancelled")
    assert loop.time() - left >= 0.19


@pytest.mark.parametrize("explicit", ["start", "warm_up"])
async def test_an_explicit_start_joined_is_never_cancelled(rig: Any, explicit: str) -> None:
    r: Rig = rig()
    request = await _started(r)
    if explicit == "start":
        admin = asyncio.create_task(r.backend.start())  # POST /backends/b/start, a restore
    else:
        assert await r.backend.requests.warm_up()  # a priced-out chain warms it
    await r.leave(request)
    r.runtime.gate.set()
    await until(lambda: state_of(r.backend) is BackendState.READY, what="the start to go on")
    if explicit == "start":
        await admin
    assert r.cancelled() == []
    assert r.runtime.stops == 0


async def test_an_explicit_start_that_requests_join_is_never_cancelled(rig: Any) -> None:
    r: Rig = rig()
    admin = asyncio.create_task(r.backend.start())
    await until(lambda: r.runtime.starts == 1, what="the runtime asked to start")
    await r.leave(r.held())
    r.runtime.gate.set()
    await admin
    assert state_of(r.backend) is BackendState.READY
    assert r.cancelled() == []


@pytest.mark.parametrize("lifecycle", ["pinned", "standby"])
async def test_pinned_and_standby_starts_are_never_cancelled(rig: Any, lifecycle: str) -> None:
    r: Rig = rig(lifecycle=lifecycle)
    await r.leave(await _started(r))
    r.runtime.gate.set()
    await until(lambda: state_of(r.backend) is BackendState.READY, what="the start to go on")
    assert r.cancelled() == []


async def test_a_chains_shorter_wait_running_out_keeps_the_start(rig: Any) -> None:
    # The chain moves on to its next entry; the local start goes on for the next request.
    r: Rig = rig(max_wait_s=120)
    with pytest.raises(WakeTimeout):
        await r.backend.requests.acquire(max_wait_s=0.05)
    r.runtime.gate.set()
    await until(lambda: state_of(r.backend) is BackendState.READY, what="the start to go on")
    assert r.cancelled() == []


async def test_a_request_after_the_cancel_starts_it_again(rig: Any) -> None:
    r: Rig = rig()
    await r.leave(await _started(r))
    await until(lambda: state_of(r.backend) is BackendState.STOPPED, what="the start cancelled")
    r.runtime.gate.set()
    (await r.backend.requests.acquire()).release()
    assert r.runtime.starts == 2
    assert state_of(r.backend) is BackendState.READY


async def test_a_failed_start_is_not_counted_as_cancelled(rig: Any) -> None:
    r: Rig = rig()
    request = await _started(r)
    r.runtime.code = 1  # the server dies while starting: its waiter hears why
    r.runtime.gate.set()
    with pytest.raises(BackendUnavailable):
        await request
    assert state_of(r.backend) is BackendState.FAILED
    assert r.cancelled() == []


async def _started(r: Rig) -> asyncio.Task[Any]:
    """A request held while the start it began launches."""
    request = r.held()
    await until(lambda: r.runtime.starts == 1, what="the runtime asked to start")
    return request
