"""Switching GPU profiles (`gpu_profiles.yaml`) at run time.

The active profile decides which backends may run: a disabled backend is blocked (its
requests get 503 `backend_disabled` or go to their fallback chain) and stopped after
draining; a backend enabled again becomes startable (pinned ones are started at once).
It also picks each backend's yield method (`sleep_mode`). The active profile is saved
in the state file and survives restarts. `activate()` answers a typed `ProfileActivation`;
`app.api.views` renders it and the profiles.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from app.errors import BackendUnavailable, ErrorCode, NotFound
from app.events import EventLog
from app.lifecycle.backend import Backend
from app.lifecycle.blocks import BlockKind
from app.lifecycle.metrics import LifecycleMetrics
from app.lifecycle.state import BackendState, StopReason
from app.lifecycle.store import StateStore
from app.settings.profiles import GpuProfilesConfig, ProfileConfig
from app.tasks import OwnedTasks

logger = logging.getLogger(__name__)

BLOCK_KEY: Final = "profile"
STATE_SECTION: Final = "profile"


@dataclass(frozen=True, slots=True)
class ProfileChange:
    """What activating a profile changes, by backend name."""

    disable: tuple[str, ...]  # enabled before, disabled now: drain and stop
    enable: tuple[str, ...]  # disabled before, enabled now: startable again


def diff(backends: Iterable[str], old: ProfileConfig | None, new: ProfileConfig) -> ProfileChange:
    """Which backends a switch from `old` (None: nothing disabled) to `new` turns off/on."""
    names = list(backends)
    was = {n: (old is None or old.enabled(n)) for n in names}
    now = {n: new.enabled(n) for n in names}
    return ProfileChange(
        disable=tuple(n for n in names if was[n] and not now[n]),
        enable=tuple(n for n in names if not was[n] and now[n]),
    )


@dataclass(frozen=True, slots=True)
class ProfileActivation:
    """What a switch did: the change, what it stopped and started, what could not stop."""

    active: str
    previous: str | None
    change: ProfileChange
    stopped: tuple[str, ...]
    started: tuple[str, ...]
    drain_timeouts: tuple[str, ...]
    failed: dict[str, str]  # backend -> why it could not be stopped

    @property
    def changed(self) -> bool:
        return self.previous != self.active


class ProfileSwitch:
    def __init__(
        self,
        profiles: GpuProfilesConfig | None,
        backends: Mapping[str, Backend],
        store: StateStore,
        metrics: LifecycleMetrics,
        events: EventLog,
        *,
        on_switch: Callable[[], None] | None = None,
    ) -> None:
        self.profiles = profiles
        self._on_switch = on_switch  # re-plans footprints (a profile's shares)
        self._backends = backends
        self._store = store
        self._metrics = metrics
        self._events = events
        self.active: str | None = None
        self._lock = asyncio.Lock()
        self._tasks = OwnedTasks()  # starts of backends enabled again
        if profiles is not None:
            for name in profiles.profiles:
                metrics.profile_active.labels(name)

    @property
    def profile(self) -> ProfileConfig | None:
        if self.profiles is None or self.active is None:
            return None
        return self.profiles.profiles[self.active]

    def restore(self) -> str | None:
        """At start-up, before any backend is brought up: the saved profile if it still
        exists, else the file's `active` (or first) one; its blocks are placed now."""
        if self.profiles is None:
            return None
        saved = self._store.section(STATE_SECTION)
        if isinstance(saved, str) and saved in self.profiles.profiles:
            self.active = saved
        else:
            if saved is not None:
                logger.warning("saved GPU profile no longer exists, using the default "
                               "saved=%r default=%s", saved, self.profiles.default)  # fmt: skip
            self.active = self.profiles.default
        self._apply(self.profiles.profiles[self.active])
        logger.info("gpu profile active profile=%s", self.active)
        return self.active

    def reapply(self) -> None:
        """The active profile's blocks and yield methods again, for backend objects
        built since (a configuration reload's added and rebuilt ones); no I/O."""
        profile = self.profile
        if profile is not None:
            self._apply(profile)

    def _apply(self, profile: ProfileConfig) -> None:
        """Blocks, yield methods and metrics of `profile` (no I/O)."""
        assert self.profiles is not None
        assert self.active is not None
        for name, backend in self._backends.items():
            enabled = profile.enabled(name)
            if enabled:
                backend.unblock(BLOCK_KEY)
            else:
                backend.block(BLOCK_KEY, f"GPU profile {self.active!r}", BlockKind.DISABLED)
            model = profile.models.get(name)
            sleep_mode = None if model is None else model.sleep_mode
            backend.memory.set_yield_method(None if sleep_mode is None else (
                "sleep" if sleep_mode else "stop"
            ))  # fmt: skip
            self._metrics.backend_enabled.labels(name).set(1 if enabled else 0)
        for name in self.profiles.profiles:
            self._metrics.profile_active.labels(name).set(1 if name == self.active else 0)

    async def activate(self, name: str) -> ProfileActivation:
        if self.profiles is None:
            raise NotFound(
                "no GPU profiles are configured (add gpu_profiles.yaml to the config directory)",
                code=ErrorCode.PROFILE_NOT_FOUND,
            )
        new = self.profiles.profiles.get(name)
        if new is None:
            raise NotFound(
                f"no GPU profile {name!r} (profiles: {', '.join(self.profiles.profiles)})",
                code=ErrorCode.PROFILE_NOT_FOUND,
            )
        async with self._lock:
            previous = self.active
            change = diff(self._backends, self.profile, new)
            await self._store.hold(STATE_SECTION, name)  # StateWriteError: nothing changed
            self.active = name
            self._apply(new)  # blocks first: requests during the drain do not wake them
            if self._on_switch is not None:
                self._on_switch()
            stopped, drain_timeouts, failed = await self._stop(change.disable)
            started = [b.name for b in self._startable(change.enable)]
            for backend_name in started:
                backend = self._backends[backend_name]
                self._tasks.spawn(backend.start_logged("profile"), f"profile-start:{backend_name}")
        logger.info("gpu profile switched from=%s to=%s disabled=%s enabled=%s",
                    previous, name, ",".join(change.disable) or "-",
                    ",".join(change.enable) or "-")  # fmt: skip
        self._events.record(
            "profile",
            active=name,
            previous=previous,
            disabled=list(change.disable),
            enabled=list(change.enable),
            stopped=stopped,
        )
        return ProfileActivation(
            active=name,
            previous=previous,
            change=change,
            stopped=tuple(stopped),
            started=tuple(started),
            drain_timeouts=tuple(drain_timeouts),
            failed=failed,
        )

    async def _stop(self, names: tuple[str, ...]) -> tuple[list[str], list[str], dict[str, str]]:
        backends = [self._backends[n] for n in names]
        was_down = {b.name for b in backends if b.state is BackendState.STOPPED}
        results = await asyncio.gather(
            *(b.stop(StopReason.PROFILE) for b in backends), return_exceptions=True
        )
        stopped, drain_timeouts, failed = [], [], {}
        for backend, result in zip(backends, results, strict=True):
            if isinstance(result, BackendUnavailable):
                failed[backend.name] = result.message
            elif isinstance(result, BaseException):
                raise result
            elif backend.name not in was_down:
                stopped.append(backend.name)
                if backend.last_drain_timed_out:
                    drain_timeouts.append(backend.name)
        return stopped, drain_timeouts, failed

    def _startable(self, names: tuple[str, ...]) -> list[Backend]:
        """Newly enabled pinned backends that nothing else blocks: start them now."""
        return [
            b
            for b in (self._backends[n] for n in names)
            if not b.lazy and b.runtime.managed and not b.blocks
        ]

    async def close(self) -> None:
        await self._tasks.close()
