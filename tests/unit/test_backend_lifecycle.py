"""The backend lifecycle with a gated fake runtime: no processes, no sleeps."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.errors import UpstreamUnavailable
from app.lifecycle.backend import Backend
from app.lifecycle.state import BackendState
from app.metrics import Metrics
from app.settings import BackendConfig, Timeouts
from app.upstreams.http import HttpUpstream


class GatedRuntime:
    """A managed runtime whose start waits for the test to open `gate`."""

    kind = "fake"
    managed = True

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.starts = 0
        self.stops = 0
        self.code: int | None = None

    async def start(self) -> None:
        self.starts += 1
        await self.gate.wait()

    async def stop(self) -> None:
        self.stops += 1

    def exit_code(self) -> int | None:
        return self.code

    def describe(self) -> str:
        return "fake"


def state_of(backend: Backend) -> BackendState:
    # A fresh read, so the type checker does not carry an earlier narrowing over an await.
    return backend.state


def healthy(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200)


def make_backend(runtime: GatedRuntime, handler=healthy) -> Backend:  # type: ignore[no-untyped-def]
    config = BackendConfig(url="http://backend:8000", models=["m"])
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    upstream = HttpUpstream("b", config.url, Timeouts())
    return Backend("b", config, runtime, upstream, client, Metrics())


async def test_fifty_concurrent_starts_make_exactly_one() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime)
    callers = [asyncio.create_task(backend.start()) for _ in range(50)]
    await asyncio.sleep(0)  # let every caller reach the shared start
    assert backend.state is BackendState.STARTING
    runtime.gate.set()
    await asyncio.gather(*callers)
    assert runtime.starts == 1
    assert state_of(backend) is BackendState.READY
    await backend.ensure_ready()


async def test_cancelling_the_first_caller_does_not_cancel_the_start() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime)
    first = asyncio.create_task(backend.start())
    second = asyncio.create_task(backend.start())
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    runtime.gate.set()
    await second
    assert backend.state is BackendState.READY
    assert runtime.starts == 1


async def test_requests_while_starting_get_503_with_retry_after() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime)
    starting = asyncio.create_task(backend.start())
    await asyncio.sleep(0)
    with pytest.raises(UpstreamUnavailable) as info:
        await backend.ensure_ready()
    assert info.value.headers == {"retry-after": "5"}
    assert "is starting" in info.value.message
    runtime.gate.set()
    await starting


async def test_a_server_that_dies_while_ready_fails_the_next_request() -> None:
    runtime = GatedRuntime()
    runtime.gate.set()
    backend = make_backend(runtime)
    await backend.start()
    runtime.code = 137
    with pytest.raises(UpstreamUnavailable) as info:
        await backend.ensure_ready()
    assert backend.state is BackendState.FAILED
    assert info.value.message == "backend 'b' is failed: its server exited with code 137"


async def test_leases_count_in_flight_and_release_once() -> None:
    backend = make_backend(GatedRuntime())
    first, second = backend.lease(), backend.lease()
    assert backend.in_flight == 2
    first.release()
    first.release()
    assert backend.in_flight == 1
    second.release()
    assert backend.in_flight == 0


async def test_health_checks_record_failures_without_raising() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    backend = make_backend(GatedRuntime(), refuse)
    assert await backend.check_health() is False
    assert backend.healthy is False
    assert backend.health_error == "ConnectError: refused"


async def test_stop_during_start_ends_stopped() -> None:
    runtime = GatedRuntime()
    backend = make_backend(runtime)
    starting = asyncio.create_task(backend.start())
    await asyncio.sleep(0)
    await backend.stop()
    assert backend.state is BackendState.STOPPED
    assert runtime.stops == 1
    with pytest.raises(asyncio.CancelledError):
        await starting
