"""create_app(settings, *, seams) -> FastAPI. Nothing is built at import time."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Final

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from app import logs
from app.access.auth import exposure_warnings
from app.access.origins import OriginPolicy
from app.activity import Activity
from app.api import (
    activity,
    backends,
    config,
    handlers,
    messages,
    models,
    openai,
    openapi,
    ops,
    output,
    profiles,
    stream,
    ui,
    usage,
    vram,
)
from app.api.fastpath import GatewayApp
from app.api.ollama import routes as ollama
from app.control.loop_lag import LoopLag
from app.gpu.auto import auto_probes
from app.lifecycle.metrics import LifecycleMetrics
from app.metrics import Declare
from app.reload.apply import Reloader
from app.services import Seams, Services
from app.settings import Settings
from app.tasks import cancel_and_wait, spawn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReloadOptions:
    sighup: bool = False  # SIGHUP reloads (serve installs it; the default kills the process)
    watch: bool = False  # poll the config directory's files (`serve --watch-config`)
    overrides: Mapping[str, Any] = field(default_factory=dict)  # `serve --host/--port`


def create_app(
    settings: Settings,
    *,
    seams: Seams | None = None,
    registry: CollectorRegistry | None = None,
    reload: ReloadOptions | None = None,
    connections: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """`reload`: how `serve` reloads its configuration (SIGHUP, `--watch-config`, the
    command line's values to apply at every load); `POST /config/reload` always works.
    `connections`: the server's connection cap and its use (`GET /status`), from `serve`."""
    reload = reload or ReloadOptions()
    metrics = LifecycleMetrics(registry)
    loop_lag = LoopLag(metrics.registry)  # sampled while the app runs (its lifespan's task)
    requests = Activity(settings.activity_size)  # recorded by the access middleware

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for warning in exposure_warnings(
            settings.host, api_keys=settings.has_client_keys, admin_key=bool(settings.admin_key)
        ):
            logger.warning("exposed: %s", warning)
        own_seams = seams or Seams()
        # `gpu.probe: auto` asks NVML (blocking calls that can hang): off the loop.
        probes = await asyncio.to_thread(auto_probes, settings, nvml=own_seams.nvml)
        services = Services(settings, metrics, own_seams, activity=requests, probes=probes)
        app.state.services = services
        reloader = app.state.reloader = Reloader(services, reload.overrides)
        await services.start()
        stopping = _Stopping(services, settings.shutdown_grace_s)
        restore_signals = _on_stop_signal(stopping)
        forget_sighup = _on_sighup(reloader) if reload.sighup else (lambda: None)
        if reload.watch:
            reloader.watch()
        # What start-up built lives as long as the app: keep it out of every later GC pass
        # (full collections of it paused the loop for ~50 ms under load).
        gc.collect()
        gc.freeze()
        lag = spawn(loop_lag.run(), name="event-loop-lag")
        try:
            yield
        finally:
            await cancel_and_wait(lag)
            restore_signals()
            forget_sighup()
            stopping.cancel()
            await reloader.close()
            await services.close()
            logs.drain()  # no request is left: write the queued access lines

    app = GatewayApp(
        metrics=metrics,
        access_log=settings.access_log,
        activity=requests,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.server.body_timeout_s,
        fast_routes=[*openai.routes, *messages.routes, *ollama.routes],
        origins=OriginPolicy.from_settings(settings),
        client_keys=settings.has_client_keys,
        admin_key=settings.admin_key is not None,
        title="microscheduler",
        summary="OpenAI-compatible gateway for local vLLM servers sharing one GPU.",
        lifespan=lifespan,
        # Swagger UI and ReDoc load their scripts from a CDN; the schema stays.
        docs_url=None,
        redoc_url=None,
        default_response_class=handlers.JSONBody,
    )
    app.state.connections = connections
    if connections is not None:
        _connection_series(metrics, connections)
    _install_routes(app)
    return app


def _connection_series(metrics: LifecycleMetrics, view: Callable[[], dict[str, Any]]) -> None:
    """The client connections' series, read from the server at each scrape."""
    new = Declare(metrics.registry)
    gauge = new.gauge(
        "client_connections",
        "Client connections: open (counted against the cap), queued (a request each, "
        "waiting over the cap), max (the cap).",
        ["state"],
    )

    def reads(state: str) -> Callable[[], float]:
        return lambda: float(view()[state])

    for state in ("open", "queued", "max"):
        gauge.labels(state).set_function(reads(state))
    accepting = new.gauge(
        "client_connections_accepting",
        "1 while the gateway accepts connections; 0 while its queue over the connection "
        "cap is full and newcomers wait in the kernel's backlog.",
    )
    accepting.set_function(lambda: float(view()["accepting"]))


def _install_routes(app: FastAPI) -> None:
    """The error handlers, the admin routers, the data plane's routes, the control page
    and the OpenAPI schema."""
    handlers.install(app)
    app.include_router(ops.router)
    app.include_router(activity.router)
    app.include_router(usage.router)
    app.include_router(stream.router)
    app.include_router(backends.router)
    app.include_router(output.router)
    app.include_router(vram.router)
    app.include_router(profiles.router)
    app.include_router(config.router)
    app.include_router(models.router)
    app.router.routes.extend(openai.routes)
    app.router.routes.extend(messages.routes)
    app.router.routes.extend(ollama.routes)
    app.router.routes.extend(ui.routes)
    openapi.install(app)


# Responses still open this long before the server's grace is over are ended in-band.
RELAY_END_MARGIN_S: Final = 1.0


def relay_end_delay(grace_s: float) -> float:
    """How long after the stop signal the responses still open are ended: a margin before
    the server's grace runs out (uvicorn then cancels them, cut with no end), or half the
    grace when it is under two margins."""
    return max(grace_s - RELAY_END_MARGIN_S, grace_s / 2)


class _Stopping:
    """What the stop signal sets going: `/status/stream` ends at once; the relays still
    open at `relay_end_delay` end with the in-band error (`OpenRelays.end_all`)."""

    def __init__(self, services: Services, grace_s: float) -> None:
        self._services = services
        self._grace_s = grace_s
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self) -> None:
        self._services.events.end_streams("stopping")
        if self._timer is None:
            delay = relay_end_delay(self._grace_s)
            self._timer = asyncio.get_running_loop().call_later(delay, self._end_relays)

    def _end_relays(self) -> None:
        ended = self._services.relays.end_all()
        if ended:
            logger.warning("shutdown grace nearly over: %d open responses ended in-band", ended)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _on_stop_signal(callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback` on the loop when SIGTERM or SIGINT arrives, before the handler
    already installed (uvicorn's, which starts the graceful shutdown: uvicorn tells the
    app nothing until its connections are done). Returns what restores the handlers.
    Only a callable handler is chained (none is installed outside the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    previous: dict[signal.Signals, Callable[[int, FrameType | None], Any]] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(signum)
        if not callable(handler):
            continue

        def chained(
            number: int,
            frame: FrameType | None,
            handler: Callable[[int, FrameType | None], Any] = handler,
        ) -> None:
            loop.call_soon_threadsafe(callback)
            handler(number, frame)

        previous[signum] = handler
        signal.signal(signum, chained)

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    return restore


def _on_sighup(reloader: Reloader) -> Callable[[], None]:
    """SIGHUP reloads the configuration (`Reloader.on_signal`) instead of ending the
    process; returns what removes the handler. Only in the main thread (the loop's)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, reloader.on_signal)

    def forget() -> None:
        loop.remove_signal_handler(signal.SIGHUP)

    return forget
