"""Schedules through the API, on a clock the test sets (`Seams.clock`): a window yields at
its start and restores at its end, a manual restore inside it wins until its next edge, a
keep_warm window keeps a lazy backend from its idle stop, and `/status` shows each window.

The backend is the fake vLLM in process (`FakeVllmRuntime`) on the simulated GPU; the
gateway's time zone is UTC, so the windows' times are the clock's."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from app.runtimes.base import Runtime
from app.services import Seams
from app.settings import BackendConfig
from tests.fakes.clock import FakeClock, at
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeVllmRuntime,
    Gateway,
    chat,
    gateway,
    gateway_settings,
    until_backend,
)

EVERY_DAY = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
MONDAY = "2025-01-06"  # a Monday
TUESDAY = "2025-01-07"


@asynccontextmanager
async def scheduled(
    tmp_path: Path, schedules: list[dict[str, Any]], clock: FakeClock, **backend: Any
) -> AsyncIterator[tuple[Gateway, FakeVllmRuntime]]:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["m"])

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtime

    settings = gateway_settings(
        {
            "reasoning": {
                "url": f"http://127.0.0.1:{port}",
                "models": ["m"],
                "runtime": {"kind": "process", "command": ["unused: the test's runtime"]},
                "lifecycle": "lazy",
                "vram_mib": 1000,
                **backend,
            }
        },
        state_dir=tmp_path / "var",
        gpu={"probe": "sim", "poll_interval_s": 0.05, "sim": {"total_mib": 8000}},
        reaper_interval_s=0.05,
        timezone="UTC",
        schedules=schedules,
    )
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for, clock=clock)) as gw:
        await clock.settled()  # the first look at the clock is done
        yield gw, runtime


async def status(gw: Gateway) -> dict[str, Any]:
    response = await gw.client.get("/status")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def schedule(gw: Gateway, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(s for s in (await status(gw))["schedules"] if s["name"] == name)
    return found


async def yield_state(gw: Gateway) -> str:
    state: str = (await status(gw))["holds"]["yield"]["state"]
    return state


EVENING = {"name": "evening", "days": EVERY_DAY, "from": "19:00", "to": "23:00",
           "action": "yield", "reason": "gaming"}  # fmt: skip


async def test_a_window_yields_at_its_start_and_restores_at_its_end(tmp_path: Path) -> None:
    clock = FakeClock(at(f"{MONDAY}T18:00"))
    async with scheduled(tmp_path, [EVENING], clock) as (gw, _runtime):
        assert (await schedule(gw, "evening")) == {
            "name": "evening", "action": "yield", "active": False,
            "next_edge_at": at(f"{MONDAY}T19:00"), "overridden": False,
        }  # fmt: skip
        assert (await gw.client.post("/v1/chat/completions", json=chat("m"))).status_code == 200
        assert await yield_state(gw) == "none"

        await clock.advance_to(at(f"{MONDAY}T19:00"))
        held = (await status(gw))["holds"]["yield"]
        assert (held["state"], held["reason"]) == ("yielded", "gaming")
        assert "reasoning" in held["stopped"]
        await until_backend(gw, "reasoning", state="stopped")
        shown = await schedule(gw, "evening")
        assert (shown["active"], shown["overridden"]) == (True, False)
        assert shown["next_edge_at"] == at(f"{MONDAY}T23:00")
        refused = await gw.client.post("/v1/chat/completions", json=chat("m"))
        assert refused.status_code == 503  # yielded: the model stays off during the window

        await clock.advance_to(at(f"{MONDAY}T23:00"))
        assert await yield_state(gw) == "none"
        assert (await schedule(gw, "evening"))["active"] is False
        assert (await gw.client.post("/v1/chat/completions", json=chat("m"))).status_code == 200
        kinds = [(e["kind"], e.get("did")) for e in (await status(gw))["events"]]
        assert ("schedule", "yielded") in kinds
        assert ("schedule", "restored") in kinds
        # The loop waits for the next edge, or TICK_S when that is further away.
        assert max(clock.sleeps) <= 30.1


async def test_a_manual_restore_inside_the_window_wins_until_its_next_edge(
    tmp_path: Path,
) -> None:
    clock = FakeClock(at(f"{MONDAY}T19:30"))  # the gateway starts inside the window
    async with scheduled(tmp_path, [EVENING], clock) as (gw, _runtime):
        assert await yield_state(gw) == "yielded"
        restored = await gw.client.post("/vram/restore")
        assert restored.status_code == 200, restored.text
        shown = await schedule(gw, "evening")
        assert (shown["active"], shown["overridden"]) == (True, True)

        await clock.advance_to(at(f"{MONDAY}T20:00"))  # inside the window: not re-applied
        assert await yield_state(gw) == "none"
        assert (await gw.client.post("/v1/chat/completions", json=chat("m"))).status_code == 200

        await clock.advance_to(at(f"{MONDAY}T23:00"))  # its end: nothing to restore
        assert await yield_state(gw) == "none"
        await clock.advance_to(at(f"{TUESDAY}T19:00"))  # the next start applies again
        assert await yield_state(gw) == "yielded"
        shown = await schedule(gw, "evening")
        assert (shown["active"], shown["overridden"]) == (True, False)


async def test_keep_warm_holds_a_lazy_backend_against_its_idle_stop(tmp_path: Path) -> None:
    office = {"name": "office", "days": ["mon"], "from": "08:00", "to": "18:00",
              "action": "keep_warm", "backend": "reasoning"}  # fmt: skip
    clock = FakeClock(at(f"{MONDAY}T09:00"))
    async with scheduled(tmp_path, [office], clock, idle_ttl_s=0.2) as (gw, runtime):
        await until_backend(gw, "reasoning", state="ready")  # started by the window
        assert runtime.starts == 1
        assert (await gw.client.post("/v1/chat/completions", json=chat("m"))).status_code == 200
        backend = gw.app.state.services.backends["reasoning"]
        assert backend.requests.idle_stop_in_s() is None  # no countdown while held warm
        # An hour past its idle TTL, the reaper's own decision keeps it.
        assert await backend.stop_if_idle(time.monotonic() + 3600) is False
        assert backend.state == "ready"
        assert runtime.stops == 0

        await clock.advance_to(at(f"{MONDAY}T18:00"))  # the window ends: the TTL applies
        await until_backend(gw, "reasoning", state="stopped")
        assert runtime.stops == 1
        assert (await schedule(gw, "office"))["active"] is False


async def holders(gw: Gateway) -> list[str]:
    found: list[str] = (await status(gw))["holds"]["yield"].get("holders", [])
    return found


# No `reason`: its holds are "schedule evening"'s.
WINDOW = {"name": "evening", "days": EVERY_DAY, "from": "19:00", "to": "23:00",
          "action": "yield"}  # fmt: skip


async def test_a_windows_end_leaves_a_game_held_before_it_yielded(tmp_path: Path) -> None:
    """Issue 33: a person's yield taken before the window is not ended by the window's end."""
    clock = FakeClock(at(f"{MONDAY}T18:00"))
    async with scheduled(tmp_path, [WINDOW], clock) as (gw, _runtime):
        taken = await gw.client.post("/vram/yield", json={"reason": "game"})
        assert taken.status_code == 200, taken.text
        await clock.advance_to(at(f"{MONDAY}T19:00"))  # the window adds its own hold
        assert (await schedule(gw, "evening"))["overridden"] is False

        await clock.advance_to(at(f"{MONDAY}T23:00"))  # it lets go of its own hold only
        assert await yield_state(gw) == "yielded"
        refused = await gw.client.post("/v1/chat/completions", json=chat("m"))
        assert refused.status_code == 503  # the game still has the GPU
        assert await holders(gw) == ["game"]
        dids = [e.get("did") for e in (await status(gw))["events"] if e["kind"] == "schedule"]
        assert dids[-1] == "its hold let go of; the yield holds on for game"


async def test_a_game_taken_during_the_window_outlasts_it(tmp_path: Path) -> None:
    """Issue 33: a POST during the window answers the caller's own hold, and the window's
    end leaves it."""
    clock = FakeClock(at(f"{MONDAY}T18:00"))
    async with scheduled(tmp_path, [WINDOW], clock) as (gw, _runtime):
        await clock.advance_to(at(f"{MONDAY}T19:00"))
        taken = await gw.client.post("/vram/yield", json={"reason": "game", "ttl_s": 3600})
        assert taken.status_code == 200, taken.text
        body = taken.json()
        assert (body["already"], body["reason"]) == (True, "game")  # was "schedule evening"
        assert body["hold"]["reason"] == "game"
        assert body["expires_at"] == body["hold"]["expires_at"] is not None
        assert [h["reason"] for h in body["holds"]] == ["schedule evening", "game"]

        await clock.advance_to(at(f"{MONDAY}T23:00"))
        assert await yield_state(gw) == "yielded"
        assert await holders(gw) == ["game"]
        restored = await gw.client.post("/vram/restore", json={"reason": "game"})
        assert restored.json()["restored"] is True
        assert await yield_state(gw) == "none"
        assert (await gw.client.post("/v1/chat/completions", json=chat("m"))).status_code == 200
