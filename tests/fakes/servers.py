"""Real servers on 127.0.0.1 for tests: the fake vLLM in process, the gateway in process."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from aiohttp import web
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from app.gpu.host_ram import FixedRamSource
from app.main import create_app
from app.runtimes.base import RuntimeStatus
from app.services import Seams
from app.settings import Settings, default_state_dir
from app.sim.vllm import FAKE_VLLM_KEY, FakeConfig, build_app
from app.vram import yielding
from tests.fakes.nvml import NoNvml
from tests.fakes.waits import until


@dataclass
class FakeServer:
    url: str
    client: httpx.AsyncClient  # talks to the fake directly (faults, stats)

    async def set_faults(self, **faults: Any) -> None:
        response = await self.client.post("/_fake/faults", json=faults)
        response.raise_for_status()

    async def stats(self) -> dict[str, Any]:
        response = await self.client.get("/_fake/stats")
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
        return stats


@asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """An aiohttp app on an ephemeral port of 127.0.0.1, in this event loop; its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


# The flags a vLLM serving tool calls runs with (Claude Code always sends tools): a fake
# without them answers a request with tools 400, as vLLM 0.33 does (app.sim.tools).
TOOL_CALLING: dict[str, Any] = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
TOOL_CALLING_FLAGS: tuple[str, ...] = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


@asynccontextmanager
async def fake_vllm(**options: Any) -> AsyncIterator[FakeServer]:
    """The fake vLLM on an ephemeral port of 127.0.0.1, in this event loop. Its first
    `/openapi.json` answers at once unless `openapi_delay` says otherwise: the gateway
    reads it as every backend becomes ready, and vLLM's 0.5 s (the fake's default) would
    make a test's every gateway that much slower (measured: 14 s -> 35 s for 40 tests)."""
    config = FakeConfig(port=0, **{"openapi_delay": 0.0, **options})
    async with (
        serve_app(build_app(config)) as url,
        httpx.AsyncClient(base_url=url, timeout=5) as client,
    ):
        yield FakeServer(url, client)


@asynccontextmanager
async def sdk_http(gw: Gateway) -> AsyncIterator[httpx2.AsyncClient]:
    """The official SDKs' own HTTP client type, on the in-process gateway app."""
    transport = httpx2.ASGITransport(app=gw.app, client=("127.0.0.1", 50001))
    async with httpx2.AsyncClient(transport=transport, timeout=10) as client:
        yield client


def gateway_settings(backends: dict[str, dict[str, Any]], **fields: Any) -> Settings:
    """Settings for an in-process gateway; pass `state_dir=tmp_path` when zones are used
    (nothing is written to the state dir until a zone is acquired)."""
    return Settings(backends=backends, **{"access_log": False, **fields})


def settle_yields_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A VRAM yield's wait for the memory it freed to show (`app.vram.yielding`):
    polled every 0.05 s, and a reading that does not change taken after 0.2 s, in place
    of 0.25 s and 1 s. A fake vLLM's footprint leaves the simulated GPU's ledger as it
    stops or sleeps, so the real intervals only made a test wait; the logic is the same."""
    monkeypatch.setattr(yielding, "SETTLE_POLL_S", 0.05)
    monkeypatch.setattr(yielding, "SETTLE_QUIET_S", 0.2)


@dataclass
class Gateway:
    client: httpx.AsyncClient
    registry: CollectorRegistry
    app: Any


@asynccontextmanager
async def gateway(
    settings: Settings,
    *,
    seams: Seams | None = None,
    client_host: str = "127.0.0.1",
    configure: Callable[[FastAPI], None] | None = None,
) -> AsyncIterator[Gateway]:
    """The gateway app in process (lifespan entered), reached through httpx's ASGI transport.

    `configure` may add routes to the app before it starts (e.g. a probe for a dependency).
    """
    registry = CollectorRegistry()
    seams = seams_for_tests(seams)
    with contextlib.ExitStack() as scratch:
        if settings.state_dir == default_state_dir(settings.config_dir):
            # No state directory named: one of its own, so that no test's usage ledger
            # (cloud budgets), activity or zones are another's.
            own = scratch.enter_context(tempfile.TemporaryDirectory(prefix="gw-state-"))
            settings = settings.model_copy(update={"state_dir": Path(own)})
        app = create_app(settings, seams=seams, registry=registry)
        if configure is not None:
            configure(app)
        async with app.router.lifespan_context(app):
            # The first health round: external servers have said what they serve; their
            # fakes' request logs then start empty, as the test's own requests find them.
            await asyncio.wait_for(app.state.services.supervisor.watched.wait(), 10)
            await _forget_learning(settings)
            transport = httpx.ASGITransport(app=app, client=(client_host, 50000))
            # `Host: localhost`: admin routes without an admin key accept only the
            # gateway's names.
            async with httpx.AsyncClient(
                transport=transport, base_url="http://localhost", timeout=10
            ) as client:
                yield Gateway(client, registry, app)


# The host RAM every in-process gateway reads unless its test injects another: roomy, so
# a level-1 sleep fits, and the same on every machine (never /proc/meminfo).
TEST_RAM_TOTAL_MIB = 65536
TEST_RAM_AVAILABLE_MIB = 40960


def seams_for_tests(seams: Seams | None) -> Seams:
    """`seams` with what no test may read from the machine running it filled in: the host
    RAM (`TEST_RAM_*`) and NVML (`NoNvml`: `gpu.probe: auto` finds no GPU)."""
    seams = seams or Seams()
    if seams.ram_source is None:
        seams = replace(
            seams, ram_source=FixedRamSource(TEST_RAM_TOTAL_MIB, TEST_RAM_AVAILABLE_MIB)
        )
    if seams.nvml is None:
        seams = replace(seams, nvml=NoNvml())
    return seams


async def _forget_learning(settings: Settings) -> None:
    """Empty the request log of each fake vLLM an external backend points at (the
    gateway's start-up reads of `/openapi.json` and `/v1/models` are no test's requests)."""
    urls = {cfg.url for cfg in settings.backends.values() if not cfg.managed}
    async with httpx.AsyncClient(timeout=2) as client:
        for url in sorted(urls):
            with contextlib.suppress(httpx.HTTPError):
                await client.delete(f"{url}/_fake/stats")


class FakeVllmRuntime:
    """A managed runtime that serves the fake vLLM in this event loop on a fixed port.

    The port opens when the test sets `listening` (at once when `open_at_start`), then
    `startup_delay_s` later, like vLLM after loading (the process's `--startup-delay`,
    without a process). `start()` returns at once, like a container start, while the
    port waits for either; when it opens at once, `start()` returns with it open (the
    gateway's first health check finds it, not a refused connection and a poll later).
    `stop()` closes the server. Counts starts and stops. With `learn_gate`, its
    `/openapi.json` (what the gateway learns after health, before ready; ~0.6 s on a real
    server) answers once the test sets it; `learning` is set when it is asked.
    """

    kind = "fake-vllm"
    managed = True
    stop_on_shutdown = True

    def __init__(
        self,
        port: int,
        *,
        open_at_start: bool = True,
        startup_delay_s: float = 0.0,
        learn_gate: asyncio.Event | None = None,
        **options: Any,
    ) -> None:
        self.port = port
        self.startup_delay_s = startup_delay_s
        self.learn_gate = learn_gate
        self.learning = asyncio.Event()
        self.options = options
        self.listening = asyncio.Event()
        if open_at_start:
            self.listening.set()
        self.starts = 0
        self.started_on: list[tuple[int, ...]] = []  # the GPUs of each start
        self.stops = 0
        self.exit_code: int | None = None
        self._runner: web.AppRunner | None = None
        self._opener: asyncio.Task[None] | None = None

    async def start(self, gpus: tuple[int, ...] = (0,)) -> None:
        self.starts += 1
        self.started_on.append(gpus)
        if self._opener is not None:
            return  # already running: like `docker start` of a running container
        self.exit_code = None
        self._opener = asyncio.create_task(self._open())
        if self.listening.is_set() and self.startup_delay_s <= 0:
            await asyncio.wait({self._opener})  # open now; its failure shows in `stop()`

    async def _open(self) -> None:
        await self.listening.wait()
        if self.startup_delay_s > 0:
            await asyncio.sleep(self.startup_delay_s)  # loading: the port stays closed
        # The first /openapi.json at once unless the test says otherwise (see `fake_vllm`).
        app = build_app(FakeConfig(port=self.port, **{"openapi_delay": 0.0, **self.options}))
        if self.learn_gate is not None:
            app.middlewares.append(self._held_learning)
        app[FAKE_VLLM_KEY].vram.start(self.port)  # reports to the ledger when given one
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._runner = runner

    @web.middleware
    async def _held_learning(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path == "/openapi.json" and self.learn_gate is not None:
            self.learning.set()
            await self.learn_gate.wait()
        return await handler(request)

    async def stop(self) -> None:
        self.stops += 1
        if self._opener is not None:
            self._opener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._opener
            self._opener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def status(self) -> RuntimeStatus:
        if self.exit_code is not None:
            return RuntimeStatus(False, self.exit_code, f"exited ({self.exit_code})")
        running = self._opener is not None
        return RuntimeStatus(running=running, gpus=self.started_on[-1] if running else None)

    def describe(self) -> str:
        return f"fake vLLM on port {self.port}"


def chat(model: str, **fields: Any) -> dict[str, Any]:
    """A small chat completion request body for `model`."""
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}


async def until_backend(gw: Gateway, name: str, **expected: Any) -> dict[str, Any]:
    """The backend's `/backends` view once its fields equal `expected`."""
    seen: dict[str, Any] = {}

    async def matches() -> dict[str, Any] | None:
        response = await gw.client.get("/backends")
        seen.update(next(v for v in response.json()["backends"] if v["name"] == name))
        return dict(seen) if all(seen[k] == v for k, v in expected.items()) else None

    return await until(matches, what=lambda: f"backend {name} to have {expected}: {seen}")
