"""The schedules' loop: applies what `app.control.schedule.schedule_at` puts in force,
through the paths a person would use (the VRAM yield of the gateway's own machine, the
GPU profile switch, a backend's start), at each window's edges.

- It looks every `TICK_S` and at the next edge (`Clock`: the seam tests replace). Only a
  window's edges act: when a window begins (or is found active when the gateway starts)
  and when it ends. Between them nothing is re-applied, so a manual yield or restore (API,
  CLI) or a profile switch wins until the next edge of a window of that action.
- `yield`: at the start, the yield (`POST /vram/yield` with the window's reason,
  `min_free_mib`, `include_pinned`, `gpu`); when one holds already (a person's), the
  window adds its own hold to it. At the end, the window lets go of its own hold only
  (`POST /vram/restore` with its reason): the yield ends unless another holder (a
  person's game) holds on. A hold of the window's reason found at start-up outside its
  window (the gateway was down at its end) is let go of.
- `profile`: at the start, the switch to the window's profile (the one active before is
  remembered); at the end, back to it (after a restart inside the window: the file's
  default profile), unless that is the one active.
- `keep_warm`: at the start, the backend is held warm (never idle-stopped:
  `RequestHolds.kept_warm`) and started; at the end the hold is let go (the idle TTL counts
  from its last request as usual). A backend stopped meanwhile (a person, an eviction,
  a yield) is not started again before the next edge.
- A step that fails (a yield refused, a profile that cannot be saved) is logged and an
  event says so; the window is taken as applied, so it is not retried before its next
  edge. `/status` says `overridden` for an active window whose effect is not in force.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import tzinfo
from typing import Any, Final, Protocol

from app.control.schedule import WindowState, next_edge, schedule_at
from app.errors import GatewayError
from app.events import EventLog
from app.lifecycle.backend import Backend
from app.lifecycle.profile_switch import ProfileSwitch
from app.lifecycle.state import BackendState
from app.settings.schedules import ScheduleWindow
from app.tasks import OwnedTasks, cancel_and_wait, spawn
from app.vram.yield_answers import HoldReleased, YieldRequest
from app.vram.yielding import VramYield

logger = logging.getLogger(__name__)

TICK_S: Final = 30.0
EDGE_SLACK_S: Final = 0.05  # sleep a little past an edge: a timer may fire a hair early


class Clock(Protocol):
    """Wall-clock time and the wait between looks (tests replace both)."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class Scheduler:
    def __init__(
        self,
        windows: list[ScheduleWindow],
        tz: tzinfo,
        clock: Clock,
        *,
        vram_yield: VramYield,
        profiles: ProfileSwitch,
        backends: Mapping[str, Backend],
        events: EventLog,
    ) -> None:
        self._windows = windows
        self._tz = tz
        self._clock = clock
        self._yield = vram_yield
        self._profiles = profiles
        self._backends = backends
        self._events = events
        self._applied: dict[str, bool] = {}  # each window's state as last acted on
        self._profile_before: dict[str, str | None] = {}
        self._states: list[WindowState] = []
        self._loop: asyncio.Task[None] | None = None
        self._tasks = OwnedTasks()  # keep-warm starts

    def start(self) -> None:
        self._states = schedule_at(self._windows, self._clock.now(), self._tz)
        if self._windows:
            self._loop = spawn(self._run(), name="schedules")

    async def _run(self) -> None:
        while True:
            await self.step()
            edge = next_edge(self._states)
            wait = TICK_S if edge is None else min(TICK_S, edge - self._clock.now())
            await self._clock.sleep(max(0.0, wait) + EDGE_SLACK_S)

    async def step(self) -> None:
        """Look at the clock and act on the edges passed since the last look."""
        states = schedule_at(self._windows, self._clock.now(), self._tz)
        self._states = states
        for state in states:
            name = state.window.name
            before = self._applied.get(name)
            if before is state.active:
                continue
            self._applied[name] = state.active
            try:
                await self._edge(state.window, state.active, first=before is None)
            except GatewayError as exc:
                logger.error("schedule step failed window=%s active=%s error=%s",
                             name, state.active, exc.message)  # fmt: skip
                self._events.record("schedule_failed", name=name, action=state.window.action,
                                    active=state.active, error=exc.message)  # fmt: skip
        self._states = schedule_at(self._windows, self._clock.now(), self._tz)

    async def _edge(self, window: ScheduleWindow, active: bool, *, first: bool) -> None:
        if window.action == "yield":
            done = await self._yield_edge(window, active, first=first)
        elif window.action == "profile":
            done = await self._profile_edge(window, active, first=first)
        else:
            done = self._keep_warm_edge(window, active)
        if done is None:
            return
        logger.info("schedule window=%s action=%s active=%s did=%s",
                    window.name, window.action, active, done)  # fmt: skip
        self._events.record(
            "schedule", name=window.name, action=window.action, active=active, did=done
        )

    async def _yield_edge(self, window: ScheduleWindow, active: bool, *, first: bool) -> str | None:
        current = self._yield.current
        reason = window.yield_reason
        if active:
            request = YieldRequest(
                reason=reason,
                min_free_mib=window.min_free_mib,
                include_pinned=window.include_pinned,
                gpu=window.gpu,
            )
            outcome = await self._yield.yield_vram(request)
            if outcome.already:
                others = [h for h in outcome.zone.holders if h != reason]
                if not others:  # its own, kept across a restart
                    return "its hold renewed"
                return f"a yield already holds ({', '.join(others)}); its hold added"
            return "yielded"
        if current is None:
            return None if first else "nothing to restore (restored meanwhile)"
        if current.hold_of(reason) is None:
            # Not this window's (a person's, another's), or let go of meanwhile.
            return None if first else "its hold was let go of meanwhile"
        answer = await self._yield.restore("schedule", holder=reason)
        if isinstance(answer, HoldReleased):
            return f"its hold let go of; the yield holds on for {', '.join(answer.zone.holders)}"
        return "restored"

    async def _profile_edge(
        self, window: ScheduleWindow, active: bool, *, first: bool
    ) -> str | None:
        assert window.profile is not None  # ScheduleWindow requires it
        switch = self._profiles
        if active:
            before = switch.active
            self._profile_before[window.name] = before if before != window.profile else None
            if before == window.profile:
                return f"profile {window.profile} already active"
            await switch.activate(window.profile)
            return f"profile {before} -> {window.profile}"
        if first:
            return None
        back = self._profile_before.pop(window.name, None)
        if back is None and switch.profiles is not None:
            back = switch.profiles.default
        if back is None or back == switch.active:
            return None
        await switch.activate(back)
        return f"profile {window.profile} -> {back}"

    def _keep_warm_edge(self, window: ScheduleWindow, active: bool) -> str | None:
        assert window.backend is not None  # ScheduleWindow requires it
        backend = self._backends[window.backend]
        backend.requests.keep_warm(window.name, on=active)
        if not active:
            return f"{backend.name} no longer held warm"
        if backend.state is not BackendState.READY:
            self._tasks.spawn(backend.start_logged("schedule"), f"keep-warm:{backend.name}")
        return f"{backend.name} held warm"

    def _overridden(self, state: WindowState) -> bool:
        """An active window whose effect is not in force (a person undid it)."""
        window = state.window
        if not state.active:
            return False
        if window.action == "yield":
            current = self._yield.current  # the yield ended, or the window's hold
            return current is None or current.hold_of(window.yield_reason) is None
        if window.action == "profile":
            return self._profiles.active != window.profile
        backend = self._backends[window.backend or ""]
        return backend.state in (BackendState.STOPPED, BackendState.FAILED)

    def status(self) -> list[dict[str, Any]]:
        """`/status`'s `schedules`: each window, whether it is active, its next edge (Unix
        seconds) and whether what it puts in force was undone (`overridden`)."""
        return [
            {
                "name": s.window.name,
                "action": s.window.action,
                "active": s.active,
                "next_edge_at": round(s.next_edge_at, 3),
                "overridden": self._overridden(s),
            }
            for s in self._states
        ]

    async def close(self) -> None:
        await cancel_and_wait(self._loop)
        await self._tasks.close()
