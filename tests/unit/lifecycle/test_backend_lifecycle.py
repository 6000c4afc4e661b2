"""The backend lifecycle with a gated fake runtime: no processes, no sleeps."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from app.errors import BackendUnavailable, WakeTimeout
from app.lifecycle.admission import Admission, AdmissionRefused, Claimant, Unchecked
from app.lifecycle.backend import Backend
from app.lifecycle.blocks import BlockKind
from app.lifecycle.metrics import LifecycleMetrics as Metrics
from app.lifecycle.state import BackendState, StopReason
from app.runtimes.base import RuntimeFailure, RuntimeStatus
from app.settings import BackendConfig, TimeoutsConfig
from app.upstreams.http import HttpUpstream
from app.upstreams.vllm import VllmClient
from tests.fakes.waits import until


class GatedRuntime:
    """A managed runtime whose start waits for the test to open `gate`."""

    kind = "fake"
    managed = True
    stop_on_shutdown = True

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.starts = 0
        self.started_on: list[tuple[int, ...]] = []  # the GPUs of each start
        self.stops = 0
        self.running = False
        self.code: int | None = None

    async def start(self, gpus: tuple[int, ...] = (0,)) -> None:
        self.starts += 1
        self.started_on.append(gpus)
        self.running = True
        await self.gate.wait()

    async def stop(self) -> None:
        self.stops += 1
        self.running = False

    async def status(self) -> RuntimeStatus:
        return RuntimeStatus(running=self.running and self.code is None, exit_code=self.code)

    def describe(self) -> str:
        return "fake"


def state_of(backend: Backend) -> BackendState:
    # A fresh read, so the type checker does not carry an earlier narrowing over an await.
    return backend.state


def healthy(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200)


def make_backend(
    fake: GatedRuntime,
    handler: Callable[[httpx.Request], httpx.Response] = healthy,
    /,
    *,
    admission: Admission | None = None,
    metrics: Metrics | None = None,
    wake_notice_s: float = 5.0,
    restart_backoff_s: float = 5.0,
    **config: Any,
) -> Backend:
    cfg = BackendConfig(url="http://backend:8000", models=["m"], **config)
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    upstream = HttpUpstream("b", cfg.url, TimeoutsConfig())
    return Backend(
        "b",
        cfg,
        fake,
        upstream,
        VllmClient(client, cfg.url),
        metrics or Metrics(),
        admission=admission,
        wake_notice_s=wake_notice_s,
        restart_backoff_s=restart_backoff_s,
    )


LAZY: dict[str, Any] = {
    "lifecycle": "lazy",
    "vram_mib": 1000,
    "runtime": {"kind": "process", "command": ["x"]},
}


class RefusingAdmission(Unchecked):
    @contextlib.asynccontextmanager
    async def admit(self, backend: Claimant, *, wake: bool = False) -> AsyncIterator[None]:
        raise AdmissionRefused("GPU 0: 32000 of 32768 MiB in use: backend other 32000 MiB (pinned)")
        yield  # pragma: no cover


async def ready_backend(fake: GatedRuntime, /, **config: Any) -> Backend:
    fake.gate.set()
    backend = make_backend(fake, **config)
    await backend.start()
    return backend


async def test_fifty_concurrent_requests_to_a_stopped_backend_make_exactly_one_start() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime, **LAZY)
    callers = [asyncio.create_task(backend.requests.acquire()) for _ in range(50)]
    await until(
        lambda: backend.requests.waiting == 50, what="every caller held by the shared start"
    )
    assert backend.state is BackendState.STARTING
    assert backend.requests.waiting == 50
    runtime.gate.set()
    leases = await asyncio.gather(*callers)
    assert runtime.starts == 1
    assert state_of(backend) is BackendState.READY
    assert backend.requests.in_flight == 50
    assert backend.requests.waiting == 0
    for lease in leases:
        lease.release()
    assert backend.requests.in_flight == 0


async def test_cancelling_the_first_waiter_does_not_cancel_the_start() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime, **LAZY)
    first = asyncio.create_task(backend.requests.acquire())
    second = asyncio.create_task(backend.requests.acquire())
    await until(lambda: backend.requests.waiting == 2, what="both callers held")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert backend.state is BackendState.STARTING
    runtime.gate.set()
    lease = await second
    assert state_of(backend) is BackendState.READY
    assert runtime.starts == 1
    assert backend.requests.waiting == 0
    lease.release()


async def test_requests_beyond_max_waiting_get_503_with_retry_after() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime, **LAZY, max_waiting=2)
    held = [asyncio.create_task(backend.requests.acquire()) for _ in range(2)]
    await until(lambda: backend.requests.waiting == 2, what="max_waiting callers held")
    with pytest.raises(BackendUnavailable) as info:
        await backend.requests.acquire()
    assert info.value.kind == "queue_full"
    assert info.value.headers == {"retry-after": "5"}
    assert "2 waiting requests (max_waiting)" in info.value.message
    runtime.gate.set()
    for lease in await asyncio.gather(*held):
        lease.release()


async def test_a_held_request_gives_up_after_max_wait_s_and_the_start_goes_on() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime, **LAZY, max_wait_s=0.05)
    with pytest.raises(WakeTimeout) as info:
        await backend.requests.acquire()
    assert info.value.status == 504
    assert "still starting after 0.05s (max_wait_s)" in info.value.message
    assert backend.state is BackendState.STARTING
    runtime.gate.set()
    (await backend.requests.acquire()).release()
    assert runtime.starts == 1


async def test_a_held_request_is_told_every_wake_notice_interval() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime, **LAZY, wake_notice_s=0.01)
    notices: list[float] = []

    async def notice(waited_s: float, detail: str | None) -> None:
        notices.append(waited_s)
        if len(notices) == 3:
            runtime.gate.set()

    (await backend.requests.acquire(notice)).release()
    assert len(notices) >= 3
    assert notices == sorted(notices)
    assert notices[0] > 0


async def test_a_server_that_exits_while_starting_fails_its_waiters_with_the_code() -> None:
    runtime = GatedRuntime()
    runtime.gate.set()
    refuse_health = make_backend(runtime, lambda r: httpx.Response(503), **LAZY)
    waiter = asyncio.create_task(refuse_health.requests.acquire())
    await until(
        lambda: runtime.starts == 1 and refuse_health.requests.waiting == 1, what="the start"
    )
    runtime.code = 3
    with pytest.raises(BackendUnavailable) as info:
        await waiter
    assert info.value.kind == "failed"
    assert "exited with code 3 before it was ready" in info.value.message
    assert refuse_health.state is BackendState.FAILED


async def test_a_server_that_dies_while_ready_is_failed_by_the_watch() -> None:
    runtime = GatedRuntime()
    backend = await ready_backend(runtime, **LAZY)
    runtime.code = 137
    await backend.watcher.watch()
    assert backend.state is BackendState.FAILED
    assert backend.memory.holds_vram is False
    # Within the restart backoff, requests get the failure instead of a new start.
    with pytest.raises(BackendUnavailable) as info:
        await backend.requests.acquire()
    assert "its server exited with code 137" in info.value.message
    assert info.value.headers == {"retry-after": "5"}
    assert runtime.starts == 1


async def test_admission_refusal_leaves_the_backend_stopped_with_the_reason() -> None:
    runtime = GatedRuntime()
    metrics = Metrics()
    backend = make_backend(runtime, admission=RefusingAdmission(), metrics=metrics, **LAZY)
    with pytest.raises(BackendUnavailable) as info:
        await backend.requests.acquire()
    assert info.value.kind == "no_vram"
    assert "backend other 32000 MiB (pinned)" in info.value.message
    assert backend.state is BackendState.STOPPED
    assert runtime.starts == 0
    assert (
        metrics.registry.get_sample_value(
            "microscheduler_backend_starts_total", {"backend": "b", "outcome": "refused"}
        )
        == 1
    )


async def test_a_blocked_backend_refuses_without_starting() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime, **LAZY)
    backend.block("zone:img", "VRAM zone 'img' (held by 'comfyui', 12000 MiB on GPU 0)")
    with pytest.raises(BackendUnavailable) as info:
        await backend.requests.acquire()
    assert info.value.kind == "blocked"
    assert "VRAM zone 'img' (held by 'comfyui'" in info.value.message
    assert runtime.starts == 0


async def test_leases_count_in_flight_and_release_once() -> None:
    backend = await ready_backend(GatedRuntime())
    first, second = await backend.requests.acquire(), await backend.requests.acquire()
    assert backend.requests.in_flight == 2
    first.release()
    first.release()
    assert backend.requests.in_flight == 1
    second.release()
    assert backend.requests.in_flight == 0


async def test_health_checks_record_failures_without_raising() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    backend = make_backend(GatedRuntime(), refuse)
    assert await backend.watcher.check_health() is False
    assert backend.server.healthy is False
    assert backend.server.health_error == "ConnectError: refused"


async def test_stop_during_start_ends_stopped_and_fails_the_waiters() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime, **LAZY)
    waiter = asyncio.create_task(backend.requests.acquire())
    await until(lambda: backend.requests.waiting == 1, what="the caller held by the start")
    await backend.stop(StopReason.ADMIN)
    assert backend.state is BackendState.STOPPED
    assert runtime.stops == 1
    with pytest.raises(BackendUnavailable) as info:
        await waiter
    assert "stop requested (admin)" in info.value.message


async def test_stop_drains_leases_before_stopping_the_runtime() -> None:
    runtime = GatedRuntime()
    metrics = Metrics()
    backend = await ready_backend(runtime, metrics=metrics, **LAZY)
    lease = await backend.requests.acquire()
    stopping = asyncio.create_task(backend.stop(StopReason.ADMIN))
    await until(lambda: backend.state is BackendState.STOPPING, what="the stop to begin")
    assert backend.state is BackendState.STOPPING
    assert runtime.stops == 0  # the stream in flight finishes first
    lease.release()
    await stopping
    assert state_of(backend) is BackendState.STOPPED
    assert runtime.stops == 1
    assert (
        metrics.registry.get_sample_value(
            "microscheduler_backend_stops_total", {"backend": "b", "reason": "admin"}
        )
        == 1
    )
    assert (
        metrics.registry.get_sample_value("microscheduler_drain_timeouts_total", {"backend": "b"})
        == 0
    )


async def test_a_drain_that_times_out_stops_anyway_and_is_counted() -> None:
    runtime = GatedRuntime()
    metrics = Metrics()
    backend = await ready_backend(runtime, metrics=metrics, drain_timeout_s=0.02, **LAZY)
    lease = await backend.requests.acquire()
    await backend.stop(StopReason.ADMIN)
    assert backend.state is BackendState.STOPPED
    assert (
        metrics.registry.get_sample_value("microscheduler_drain_timeouts_total", {"backend": "b"})
        == 1
    )
    lease.release()
    assert backend.requests.in_flight == 0


async def test_a_request_arriving_during_a_stop_waits_for_it_then_starts_again() -> None:
    runtime = GatedRuntime()
    backend = await ready_backend(runtime, **LAZY)
    in_flight = await backend.requests.acquire()
    stopping = asyncio.create_task(backend.stop(StopReason.IDLE))
    await until(lambda: backend.state is BackendState.STOPPING, what="the stop to begin")
    arriving = asyncio.create_task(backend.requests.acquire())
    await until(lambda: backend.requests.waiting == 1, what="the arriving request held")
    assert not arriving.done()  # it neither got the stopping backend nor an error
    in_flight.release()
    await stopping
    lease = await arriving
    assert state_of(backend) is BackendState.READY
    assert runtime.starts == 2
    assert runtime.stops == 1
    lease.release()


async def test_idle_stop_only_after_the_ttl_and_never_with_requests_in_flight() -> None:
    runtime = GatedRuntime()
    backend = await ready_backend(runtime, idle_ttl_s=10, **LAZY)
    now = backend.requests.last_used
    assert await backend.stop_if_idle(now + 5) is False
    lease = await backend.requests.acquire()
    assert await backend.stop_if_idle(now + 60) is False
    lease.release()
    assert await backend.stop_if_idle(backend.requests.last_used + 10) is True
    assert backend.state is BackendState.STOPPED
    assert runtime.stops == 1


async def test_pinned_backends_are_never_idle_stopped() -> None:
    backend = await ready_backend(GatedRuntime(), idle_ttl_s=10)
    assert await backend.stop_if_idle(backend.requests.last_used + 3600) is False
    assert backend.state is BackendState.READY


async def test_adopting_a_running_server_skips_admission() -> None:
    runtime = GatedRuntime()
    runtime.running = True
    runtime.gate.set()
    backend = make_backend(runtime, admission=RefusingAdmission(), **LAZY)
    await backend.adopt()
    assert backend.state is BackendState.READY
    assert backend.memory.holds_vram is True


async def test_adopting_leaves_a_server_that_does_not_run_stopped() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime, **LAZY)
    await backend.adopt()
    assert backend.state is BackendState.STOPPED
    assert runtime.starts == 0


async def test_the_watch_restarts_a_failed_pinned_backend_after_its_backoff() -> None:
    runtime = GatedRuntime()
    # 0.5 s: long enough that a loaded machine does not pass it between two lines.
    backend = await ready_backend(runtime, restart_backoff_s=0.5)
    runtime.code = 1
    await backend.watcher.watch()
    assert backend.state is BackendState.FAILED
    await backend.watcher.watch()  # within the backoff: nothing
    assert runtime.starts == 1
    await asyncio.sleep(0.55)  # the thing under test: the 0.5 s backoff passes
    runtime.code = None
    await backend.watcher.watch()
    # The restart runs as the backend's own task.
    await until(lambda: runtime.starts == 2, what="the restart")
    assert state_of(backend) is BackendState.READY


async def test_the_restart_backoff_doubles_with_each_failure_in_a_row() -> None:
    runtime = GatedRuntime()
    backend = await ready_backend(runtime, restart_backoff_s=10)
    retry_afters = []
    for _ in range(3):
        runtime.code = 1
        await backend.watcher.watch()
        with pytest.raises(BackendUnavailable) as info:
            await backend.requests.acquire()
        retry_afters.append(int(info.value.headers["retry-after"]))
        runtime.code = None
        await backend.start()  # an operator's start ignores the backoff
        assert state_of(backend) is BackendState.READY
    # Ready in between resets the count: every failure here is the first in a row.
    assert retry_afters == [10, 10, 10]
    await backend.stop(StopReason.ADMIN)
    failures = []
    for _ in range(3):
        runtime.code = 3
        with pytest.raises(BackendUnavailable) as info:
            await backend.start()
        failures.append(int(info.value.headers["retry-after"]))
    assert failures == [10, 20, 40]


async def test_lazy_backends_are_not_restarted_by_the_watch() -> None:
    runtime = GatedRuntime()
    backend = await ready_backend(runtime, restart_backoff_s=0.01, **LAZY)
    runtime.code = 1
    await backend.watcher.watch()
    await asyncio.sleep(0.02)  # past the 0.01 s backoff: a pinned backend would restart now
    await backend.watcher.watch()
    assert runtime.starts == 1
    assert backend.state is BackendState.FAILED


class UnstoppableRuntime(GatedRuntime):
    async def stop(self) -> None:
        self.stops += 1
        raise RuntimeFailure("cannot reach the Docker API at http://proxy:2375: refused")


async def test_a_stop_the_runtime_cannot_do_raises_and_keeps_counting_the_memory() -> None:
    runtime = UnstoppableRuntime()
    backend = await ready_backend(runtime, **LAZY)
    with pytest.raises(BackendUnavailable) as info:
        await backend.stop(StopReason.ADMIN)
    assert info.value.kind == "runtime"
    assert "could not be stopped: stop failed: cannot reach the Docker API" in info.value.message
    assert backend.state is BackendState.FAILED
    assert backend.memory.holds_vram is True


class UnaskableRuntime(GatedRuntime):
    """Started, but its status cannot be read (e.g. the Docker proxy is down)."""

    async def status(self) -> RuntimeStatus:
        raise RuntimeFailure("docker proxy unreachable")


async def test_a_start_that_waits_says_why_even_when_the_runtime_cannot_be_asked() -> None:
    runtime = UnaskableRuntime()
    runtime.gate.set()
    refusing = make_backend(runtime, lambda r: httpx.Response(503), **LAZY, start_timeout_s=30)
    waiter = asyncio.create_task(refusing.requests.acquire(max_wait_s=30))
    progress = await until(refusing.start_progress, what="a start that says why it waits")
    assert progress.startswith(
        "health check to http://backend:8000/health health answered 503 for "
    )
    assert progress.endswith("s; its runtime cannot be asked (docker proxy unreachable)")
    waiter.cancel()
    await refusing.stop(StopReason.ADMIN)
    assert refusing.start_progress() is None  # nothing waits any more


async def test_a_second_start_is_timed_from_its_own_beginning_at_once() -> None:
    """`load().eta_s` of a start just begun counts from that start, even before its task
    first runs: the /status poll that lands in between once saw the previous start's
    beginning (eta 0 on a 3 s start, tests/e2e/test_backend_output.py on a busy machine)."""
    runtime = GatedRuntime()
    backend = await ready_backend(runtime, **LAZY)
    runtime.gate = asyncio.Event()
    backend._clock.record(60.0, cold=True, wake_level=None)  # its last cold start: a minute
    await backend.stop(StopReason.ADMIN)
    backend._clock._under_way = (0.0, None)  # a start long ago (the monotonic clock's start)
    async with backend._lock:
        backend._begin_start(adopt=False)  # the task has not run yet
        load = backend.load()
    assert load is not None
    assert load.eta_s is not None
    assert load.eta_s >= 59
    runtime.gate.set()
    await backend.start()


async def test_a_rebuilt_backend_takes_over_the_holds_of_the_object_it_replaces() -> None:
    """A configuration reload rebuilds a backend as a new object: a yield's or a zone's
    block, a schedule's keep-warm hold and the profile's yield method placed on the old
    one carry over (the reload's own block does not), so the new one is not started
    behind a game's back or idle-stopped inside its window."""
    old = make_backend(GatedRuntime(), **LAZY)
    old.block("yield", "VRAM yield for 'gaming'", BlockKind.YIELDED)
    old.block("reload", "a configuration reload", BlockKind.DISABLED)
    old.requests.keep_warm("schedule:evening", on=True)
    old.memory.set_yield_method("sleep")
    rebuilt = make_backend(GatedRuntime(), **LAZY)
    assert rebuilt.memory.yield_method != "sleep"
    rebuilt.take_over(old, leaving="reload")
    assert dict(rebuilt.blocks) == {"yield": "VRAM yield for 'gaming'"}
    assert rebuilt.requests.kept_warm == frozenset({"schedule:evening"})
    assert rebuilt.memory.yield_method == "sleep"
    with pytest.raises(BackendUnavailable, match="gaming"):
        await rebuilt.requests.acquire()


async def test_a_woken_standby_backend_counts_down_to_its_idle_stop() -> None:
    """The reaper stops an idle standby backend like a lazy one (`Backend.lazy`): its
    countdown shows too (it said None)."""
    backend = await ready_backend(GatedRuntime(), **{**LAZY, "lifecycle": "standby",
                                                      "idle_ttl_s": 60})  # fmt: skip
    remaining = backend.requests.idle_stop_in_s()
    assert remaining is not None
    assert 0 < remaining <= 60


def test_its_parts_read_a_config_that_a_reload_replaced_in_place() -> None:
    # A reload may replace `backend.config` in place (app.reload.apply): its parts read the
    # backend's config, never a copy taken when they were made.
    backend = make_backend(GatedRuntime(), **LAZY)
    assert backend.memory.yield_method == "auto"
    backend.config = BackendConfig(
        url="http://backend:8000", models=["m"], **LAZY, **{"yield": {"method": "stop"}}
    )
    assert backend.memory.yield_method == "stop"
    assert backend.memory.yield_how.method == "stop"
