"""Applying a configuration reload to the running services: `Reloader.reload()`.

The new configuration is read and validated whole by `load_settings` (start-up's one
path); an invalid one is refused (400 listing every problem) and the running one stays.
A valid one is applied as its plan (`app.reload.plan`) says, in this order:

1. Backends that go (removed, or rebuilt for a restart) are blocked so nothing starts
   them again: a removed one's requests get 503 `backend_disabled` (or their fallback
   chain); a rebuilt one's are held (`app.routing.rebuilds`, up to the backend's
   `max_wait_s`, counted as a wake) until its new object is registered with its holds,
   then go to it: never to a paid provider, never a 503 for a rebuild.
2. Backends updated in place get their new config object; added ones are built and
   registered (new names: nothing routes to them yet).
3. The routing plane is built anew by the start's own function (`app.routing.plane.
   build_plane`) and swapped in by one assignment (`services.plane`): registry,
   dispatcher, keys (a key whose name, secret and settings stayed keeps its object: its
   windows and daily budget), authenticator, and the cloud when its inputs changed
   (providers, chains, names, roles, groups; its circuits start closed). A request in
   flight keeps the plane it read, whole: its key, route, cloud and dispatcher.
4. What goes is drained (each backend's `drain_timeout_s`) and stopped, then unregistered;
   rebuilt ones are registered with their new config.
5. A rebuilt backend takes over its old object's holds (blocks of a yield, a zone or the
   GPU profile, keep-warm holds, the profile's yield method); added ones get the active
   GPU profile's blocks and yield method;
   footprints are planned again and pinned backends that are new (or rebuilt, or became
   pinned) are brought up in the background, as at start, unless something blocks them.

Every reload is counted (`microscheduler_config_reloads_total{result}`: ok, refused,
failed), recorded on the event log (`config_reload`) and its hash, time and source are
in `/status` (`config`, `app.settings.record`). The reloader is built by the app's lifespan
(`app.main`), after the services it reloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from app.errors import BackendUnavailable, ErrorCode, InvalidRequest
from app.lifecycle.blocks import BlockKind
from app.lifecycle.state import BackendState, StopReason
from app.reload.plan import ReloadPlan, effective, plan_reload
from app.reload.watch import WATCH_INTERVAL_S, ConfigWatcher
from app.routing.plane import build_plane
from app.services import Services
from app.settings import ConfigError, Settings, load_settings
from app.settings.record import config_digest
from app.store.usage import prices_of
from app.tasks import OwnedTasks

if TYPE_CHECKING:
    from app.lifecycle.backend import Backend

logger = logging.getLogger(__name__)

BLOCK_KEY: Final = "reload"


def refusal(problems: list[str]) -> InvalidRequest:
    """The 400 of a refused reload: every problem, one per line."""
    listed = "\n".join(f"- {p}" for p in problems)
    count = f"{len(problems)} problem" + ("" if len(problems) == 1 else "s")
    return InvalidRequest(
        f"configuration refused, the running one stays ({count}):\n{listed}",
        param="config",
        code=ErrorCode.INVALID_VALUE,
    )


class Reloader:
    def __init__(self, services: Services, overrides: Mapping[str, Any] | None = None) -> None:
        self._services = services
        # The command line's values (`serve --host/--port`): they win at every load.
        self.overrides: dict[str, Any] = dict(overrides or {})
        self._lock = asyncio.Lock()
        self._tasks = OwnedTasks()
        self.record = services.config_record

    # -- triggers -----------------------------------------------------------------------

    def watch(self, interval_s: float = WATCH_INTERVAL_S) -> None:
        """Reload whenever the config directory's files change (`serve --watch-config`)."""
        watcher = ConfigWatcher(
            self._services.settings.config_dir,
            lambda: self.reload("watch"),
            interval_s=interval_s,
        )
        self._tasks.spawn(watcher.run(), name="config-watch")

    def on_signal(self) -> None:
        """SIGHUP (called on the loop): reload in the background."""
        logger.info("SIGHUP: reloading the configuration")
        self._tasks.spawn(self._quiet(self.reload("sighup")), name="config-reload")

    @staticmethod
    async def _quiet(reload: Awaitable[object]) -> None:
        with contextlib.suppress(InvalidRequest):  # refused: logged and counted by `reload`
            await reload

    async def close(self) -> None:
        await self._tasks.close()

    # -- the reload -----------------------------------------------------------------------

    async def reload(self, source: str) -> dict[str, Any]:
        """Load, check and apply the config directory; the plan applied. Raises the 400 of
        `refusal()` for an invalid configuration (nothing changed then)."""
        async with self._lock:
            services = self._services
            directory = services.settings.config_dir
            try:
                new = await asyncio.to_thread(load_settings, directory, **self.overrides)
            except ConfigError as exc:
                raise self._refused(source, exc.problems) from None
            digest = config_digest(directory)
            plan = plan_reload(services.settings, new)
            if plan.problems:
                raise self._refused(source, list(plan.problems))
            try:
                await self._apply(plan, effective(services.settings, new, plan))
            except Exception:
                self.record.failed()
                services.events.record("config_reload", result="failed", source=source)
                logger.exception("config reload failed while applying source=%s", source)
                raise
            self.record.applied(digest, source, plan.restart_required)
            summary = plan.summary()
            services.events.record(
                "config_reload", result="ok", source=source, hash=digest, **summary
            )
            logger.info("config reloaded source=%s hash=%s updated=%s restarted=%s added=%s "
                        "removed=%s", source, digest, _names(plan.in_place),
                        _names(plan.restart), _names(plan.added),
                        _names(plan.removed))  # fmt: skip
            if plan.restart_required:
                logger.warning("config reload: changes that need a restart were not applied "
                               "keys=%s", ",".join(plan.restart_required))  # fmt: skip
            return {**summary, "config": self.record.loaded.view()}

    def _refused(self, source: str, problems: list[str]) -> InvalidRequest:
        self.record.refused(source, problems)
        self._services.events.record(
            "config_reload", result="refused", source=source, problems=len(problems)
        )
        logger.error("config reload refused, the running configuration stays source=%s "
                     "problems=%d\n  %s", source, len(problems),
                     "\n  ".join(problems))  # fmt: skip
        return refusal(problems)

    async def _apply(self, plan: ReloadPlan, settings: Settings) -> None:
        services = self._services
        old = services.settings
        # First: what builds backends (their environment, timeouts) reads it. Every new
        # object is built before anything changes: a build that fails leaves it all as it was.
        services.settings = settings
        try:
            built = {
                name: services.build_backend(name, settings.backends[name])
                for name in (*plan.added, *plan.restart)
            }
        except BaseException:
            services.settings = old
            raise
        going = {name: services.backends[name] for name in (*plan.removed, *plan.restart)}
        # A rebuilt backend's requests wait for the new object, as for a wake, instead of
        # meeting the old one's block (503, or a paid provider): until it is registered.
        services.rebuilds.begin(plan.restart)
        try:
            await self._replace(plan, settings, built, going)
        finally:
            services.rebuilds.end_all()

    async def _replace(
        self,
        plan: ReloadPlan,
        settings: Settings,
        built: dict[str, Backend],
        going: dict[str, Backend],
    ) -> None:
        """`_apply` once every new object is built: block what goes, swap, take down,
        register the rebuilt ones and give them their holds; the caller then lets their
        held requests go (no await between the last step here and that)."""
        services = self._services
        for backend in going.values():
            backend.block(BLOCK_KEY, "a configuration reload", BlockKind.DISABLED)
        for name in plan.in_place:
            backend = services.backends[name]
            backend.config = settings.backends[name]
            backend.upstream.timeouts = settings.backend_timeouts(name)
        for name in plan.added:
            self._register(built[name])
        self._swap(settings)
        await asyncio.gather(*(self._take_down(b) for b in going.values()))
        for name in plan.removed:
            await self._unregister(name)
        for name in plan.restart:
            await self._unregister(name)
            built[name].take_over(going[name], leaving=BLOCK_KEY)
            self._register(built[name])
        # Added backends get the GPU profile's blocks and yield methods (rebuilt ones took
        # them over above; the profile itself needs a restart to change).
        services.profiles.reapply()
        services.supervisor.plan_footprints()
        for name in (*plan.added, *plan.restart, *plan.in_place):
            backend = services.backends[name]
            if not backend.lazy and backend.state is BackendState.STOPPED:
                self._tasks.spawn(_bring_up(backend), name=f"reload-start:{name}")

    def _swap(self, settings: Settings) -> None:
        """Build the routing plane of `settings` from the running one and swap it in: one
        assignment. A request in flight keeps the plane it read (`app.routing.plane`)."""
        services = self._services
        running = services.plane
        plane = build_plane(settings, services.plane_inputs, running)
        if plane.cloud is not running.cloud:
            services.retired.append(running.cloud)  # its sessions may serve requests in flight
            services.usage.set_providers(prices_of(settings))  # what counts as cloud
        services.plane = plane
        services.notifier.configure(settings.notify)

    def _register(self, backend: Backend) -> None:
        services = self._services
        services.backends[backend.name] = backend
        if backend.config.gpus_accounted:
            host = services.hosts[backend.config.host_name]
            mine = services.host_backends[host.name]
            mine[backend.name] = backend
            host.arbiter.attach(mine)  # declares the swaps it allows

    async def _unregister(self, name: str) -> None:
        services = self._services
        backend = services.backends.pop(name)
        for backends in services.host_backends.values():
            backends.pop(name, None)
        await backend.abandon()
        await backend.upstream.close()

    @staticmethod
    async def _take_down(backend: Backend) -> None:
        try:
            await backend.stop(StopReason.RELOAD, drain_timeout_s=backend.config.drain_timeout_s)
        except BackendUnavailable as exc:
            logger.error("reload: backend could not be stopped, it may still run "
                         "backend=%s error=%s", backend.name, exc.message)  # fmt: skip


async def _bring_up(backend: Backend) -> None:
    """A pinned backend new to the gateway: as at start (adopt a running server, else
    start it), unless something blocks it."""
    if backend.blocks:
        return
    if not backend.runtime.managed:
        await backend.start()
        return
    await backend.adopt()
    if not backend.lazy and backend.state is BackendState.STOPPED:
        await backend.start_logged("reload")


def _names(names: Iterable[str]) -> str:
    return ",".join(names) or "-"
