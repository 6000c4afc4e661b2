"""`GET /status/stream`: a snapshot, then what changed; keep-alive; slow clients dropped.

The in-process transport buffers whole responses, so these tests read the stream's
generator itself (what the route returns); tests/e2e/test_control_page.py reads it
through a real server and a browser.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from app.api import stream
from app.events import EventLog
from app.services import Seams, Services
from tests.fakes.clock import FakeClock, at
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, gateway, gateway_settings, until_backend


def parse(chunk: bytes) -> tuple[str, Any]:
    """(event name, data) of one SSE message; ("comment", text) for a comment."""
    text = chunk.decode()
    if text.startswith(":"):
        return "comment", text[1:].strip()
    lines = dict(line.split(": ", 1) for line in text.strip().split("\n"))
    return lines["event"], json.loads(lines["data"])


async def next_event(messages: AsyncGenerator[bytes, None], *, skip: tuple[str, ...] = ()) -> Any:
    while True:
        name, data = parse(await anext(messages))
        if name not in skip:
            return name, data


async def in_flight_pushed(messages: AsyncGenerator[bytes, None]) -> int:
    """The in-flight count in the next `backends` push (other sections and events, e.g.
    from a health check, may come first; the generator builds it only when read)."""
    others = ("event", "gpu", "host_ram", "holds", "profile", "fallback", "state", "schedules",
              "config")  # fmt: skip
    name, data = await next_event(messages, skip=others)
    assert name == "backends"
    count: int = data[0]["in_flight"]
    return count


@pytest.fixture
def fast_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "MIN_INTERVAL_S", 0.0)


def services_of(gw: Any) -> Services:
    services: Services = gw.app.state.services
    return services


async def test_a_snapshot_then_the_state_change_as_an_event_and_a_section(
    fast_stream: None,
) -> None:
    port = free_port()
    backends = {
        "lazy": {
            "url": f"http://127.0.0.1:{port}", "models": ["lazy-model"], "lifecycle": "lazy",
            "vram_mib": 1000, "runtime": {"kind": "process", "command": ["unused"]},
        }
    }  # fmt: skip
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    settings = gateway_settings(backends)
    async with gateway(settings, seams=Seams(runtime_factory=lambda n, c: runtime)) as gw:
        services = services_of(gw)
        sub = services.events.subscribe()
        messages = stream._stream(services, sub)
        name, snapshot = await next_event(messages)
        assert name == "snapshot"
        assert set(snapshot) >= {"gateway", "gpu", "backends", "holds", "profile", "events"}
        assert snapshot["backends"][0]["state"] == "stopped"

        started = await gw.client.post("/backends/lazy/start")
        assert started.status_code == 200
        name, event = await next_event(messages)
        assert (name, event["kind"], event["state"]) == ("event", "backend_state", "starting")
        seen: list[str] = []
        while "ready" not in seen:  # the section follows the events that changed it
            name, data = await next_event(messages, skip=("event",))
            if name == "backends":
                seen.append(data[0]["state"])
        assert seen[-1] == "ready"
        await messages.aclose()
        assert services.events.subscribers == 0


async def test_request_counts_push_the_backends_section_without_an_event(
    fast_stream: None,
) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["m"])
    backends = {
        "b": {"url": f"http://127.0.0.1:{port}", "models": ["m"],
              "runtime": {"kind": "process", "command": ["unused"]}}
    }  # fmt: skip
    async with gateway(
        gateway_settings(backends), seams=Seams(runtime_factory=lambda n, c: runtime)
    ) as gw:
        await until_backend(gw, "b", state="ready")
        services = services_of(gw)
        messages = stream._stream(services, services.events.subscribe())
        assert (await next_event(messages))[0] == "snapshot"
        lease = await services.backends["b"].requests.acquire()
        assert await in_flight_pushed(messages) == 1
        lease.release()
        assert await in_flight_pushed(messages) == 0
        await messages.aclose()


async def test_quiet_streams_get_keep_alive_comments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "KEEPALIVE_S", 0.01)
    port = free_port()
    async with gateway(
        gateway_settings({"b": {"url": f"http://127.0.0.1:{port}", "models": ["m"]}})
    ) as gw:
        services = services_of(gw)
        messages = stream._stream(services, services.events.subscribe())
        assert (await next_event(messages))[0] == "snapshot"
        # Start-up may still be reported first; then nothing changes and the comment comes.
        quiet = ("event", "backends", "gpu", "host_ram", "holds", "schedules", "config")
        comment = await next_event(messages, skip=quiet)
        assert comment == ("comment", "keep-alive")
        await messages.aclose()


def test_a_subscriber_that_falls_behind_is_dropped_and_the_log_goes_on() -> None:
    log = EventLog()
    slow = log.subscribe(max_queued=3)
    fresh = log.subscribe()
    for n in range(5):
        log.record("tick", n=n)
    assert slow.dropped
    assert log.subscribers == 1  # the slow one no longer buffers anything
    assert [e["n"] for e in fresh.take()] == [0, 1, 2, 3, 4]
    assert [e["seq"] for e in log.recent()] == [1, 2, 3, 4, 5]


async def test_a_dropped_stream_says_so_and_ends(fast_stream: None) -> None:
    port = free_port()
    async with gateway(
        gateway_settings({"b": {"url": f"http://127.0.0.1:{port}", "models": ["m"]}})
    ) as gw:
        services = services_of(gw)
        sub = services.events.subscribe(max_queued=2)
        messages = stream._stream(services, sub)
        assert (await next_event(messages))[0] == "snapshot"
        for n in range(3):  # the client reads nothing meanwhile
            services.events.record("tick", n=n)
        assert await next_event(messages) == (
            "dropped",
            {"reason": "the client fell too far behind"},
        )
        with pytest.raises(StopAsyncIteration):
            await anext(messages)


async def test_the_stream_needs_the_admin_key() -> None:
    port = free_port()
    settings = gateway_settings(
        {"b": {"url": f"http://127.0.0.1:{port}", "models": ["m"]}}, admin_key="admin-secret"
    )
    async with gateway(settings) as gw:
        refused = await gw.client.get("/status/stream")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"


async def test_the_page_is_served_and_the_root_leads_there() -> None:
    port = free_port()
    async with gateway(
        gateway_settings({"b": {"url": f"http://127.0.0.1:{port}", "models": ["m"]}})
    ) as gw:
        root = await gw.client.get("/", follow_redirects=False)
        assert (root.status_code, root.headers["location"]) == (307, "/ui")
        page = await gw.client.get("/ui")
        assert page.headers["content-type"].startswith("text/html")
        assert 'data-testid="events"' in page.text
        script = await gw.client.get("/ui/page.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert "/status/stream" in script.text
        assert (await gw.client.get("/favicon.ico")).status_code == 204


async def test_with_hosts_a_yield_on_another_host_pushes_the_hosts_section(
    fast_stream: None, tmp_path: Path
) -> None:
    hosts = {"node-c": {"docker": {"url": "http://node-c:2375"}, "gpu": {"probe": "sim"}}}
    port = free_port()
    backends = {"b": {"url": f"http://127.0.0.1:{port}", "models": ["m"], "host": "node-c",
                      "runtime": {"kind": "external"}}}  # fmt: skip
    settings = gateway_settings(backends, hosts=hosts, state_dir=tmp_path / "var")
    async with gateway(settings) as gw:
        services = services_of(gw)
        messages = stream._stream(services, services.events.subscribe())
        name, snapshot = await next_event(messages)
        assert [h["name"] for h in snapshot["hosts"]] == ["local", "node-c"]
        yielded = await gw.client.post("/vram/yield", json={"host": "node-c", "reason": "x"})
        assert yielded.status_code == 200, yielded.text
        async with asyncio.timeout(10):  # node-c's yield is in no other section
            while True:
                name, data = await next_event(
                    messages, skip=("event", "backends", "gpu", "host_ram", "holds")
                )
                assert name == "hosts"
                if data[1]["holds"]["yield"]["state"] == "yielded":
                    break
        assert data[0]["holds"]["yield"]["state"] == "none"
        await messages.aclose()


async def test_with_the_local_host_only_no_hosts_section_is_pushed(fast_stream: None) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["m"])
    backends = {
        "b": {"url": f"http://127.0.0.1:{port}", "models": ["m"], "lifecycle": "lazy",
              "vram_mib": 1000, "runtime": {"kind": "process", "command": ["unused"]}}
    }  # fmt: skip
    async with gateway(
        gateway_settings(backends), seams=Seams(runtime_factory=lambda n, c: runtime)
    ) as gw:
        services = services_of(gw)
        messages = stream._stream(services, services.events.subscribe())
        assert (await next_event(messages))[0] == "snapshot"
        assert (await gw.client.post("/vram/yield", json={"reason": "x"})).status_code == 200
        name, holds = await next_event(messages, skip=("event", "backends", "gpu", "host_ram"))
        assert (name, holds["yield"]["state"]) == ("holds", "yielded")
        await gw.client.post("/vram/restore")
        name, holds = await next_event(messages, skip=("event", "backends", "gpu", "host_ram"))
        assert (name, holds["yield"]["state"]) == ("holds", "none")
        await messages.aclose()


async def test_a_schedules_edge_and_an_override_push_the_schedules_section(
    fast_stream: None, tmp_path: Path
) -> None:
    """The page shows each window live: its start (active, next edge: its end) and a
    manual restore inside it (overridden) each push `schedules`."""
    evening = {"name": "evening", "days": ["mon"], "from": "19:00", "to": "23:00",
               "action": "yield", "reason": "gaming"}  # fmt: skip
    clock = FakeClock(at("2025-01-06T18:00"))  # a Monday, before the window
    port = free_port()
    backends = {"b": {"url": f"http://127.0.0.1:{port}", "models": ["m"],
                      "runtime": {"kind": "external"}}}  # fmt: skip
    settings = gateway_settings(
        backends, state_dir=tmp_path / "var", timezone="UTC", schedules=[evening]
    )
    async with gateway(settings, seams=Seams(clock=clock)) as gw:
        await clock.settled()
        services = services_of(gw)
        messages = stream._stream(services, services.events.subscribe())
        name, snapshot = await next_event(messages)
        assert name == "snapshot"
        assert [(s["name"], s["active"]) for s in snapshot["schedules"]] == [("evening", False)]
        assert snapshot["config"]["hash"]

        async def pushed() -> dict[str, Any]:
            others = ("event", "backends", "gpu", "host_ram", "holds", "profile", "state")
            async with asyncio.timeout(10):
                name, data = await next_event(messages, skip=others)
            assert name == "schedules"
            window: dict[str, Any] = data[0]
            return window

        await clock.advance_to(at("2025-01-06T19:00"))
        window = await pushed()
        assert (window["active"], window["overridden"]) == (True, False)
        assert window["next_edge_at"] == at("2025-01-06T23:00")
        assert (await gw.client.post("/vram/restore")).status_code == 200
        window = await pushed()
        assert (window["active"], window["overridden"]) == (True, True)
        await messages.aclose()


async def test_only_ages_moving_is_not_a_change(fast_stream: None) -> None:
    """The GPU's and the host RAM's `age_s` grow by themselves: a push for a request's
    count carries `backends` alone, not `gpu` and `host_ram` again with new ages."""
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["m"])
    backends = {
        "b": {"url": f"http://127.0.0.1:{port}", "models": ["m"],
              "runtime": {"kind": "process", "command": ["unused"]}}
    }  # fmt: skip
    async with gateway(  # a GPU whose age moves: the simulated one
        gateway_settings(backends, gpu={"probe": "sim"}),
        seams=Seams(runtime_factory=lambda n, c: runtime),
    ) as gw:
        await until_backend(gw, "b", state="ready")
        services = services_of(gw)
        messages = stream._stream(services, services.events.subscribe())
        name, snapshot = await next_event(messages)
        assert name == "snapshot"
        assert snapshot["gpu"]["age_s"] is not None  # ages that move: the case at hand
        assert snapshot["host_ram"]["age_s"] is not None
        pushed: list[str] = []
        for _ in range(5):
            await asyncio.sleep(0.02)  # the ages move on meanwhile
            lease = await services.backends["b"].requests.acquire()
            lease.release()
            while True:
                name, data = await next_event(messages, skip=("event",))
                pushed.append(name)
                if name == "backends" and data[0]["in_flight"] == 0:
                    break
        assert "gpu" not in pushed
        assert "host_ram" not in pushed
        await messages.aclose()


async def test_ages_alone_are_refreshed_when_the_stream_is_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Instead of a keep-alive comment, a quiet stream gets the sections whose ages moved:
    a page showing how old a stale reading is stays right within `KEEPALIVE_S`."""
    monkeypatch.setattr(stream, "KEEPALIVE_S", 0.05)
    port = free_port()
    backends = {"b": {"url": f"http://127.0.0.1:{port}", "models": ["m"]}}
    async with gateway(gateway_settings(backends, gpu={"probe": "sim"})) as gw:
        services = services_of(gw)
        messages = stream._stream(services, services.events.subscribe())
        name, snapshot = await next_event(messages)
        assert name == "snapshot"
        name, gpu = await next_event(messages, skip=("event", "backends", "holds", "schedules",
                                                      "config", "host_ram"))  # fmt: skip
        assert name == "gpu"
        assert gpu["age_s"] != snapshot["gpu"]["age_s"]
        await messages.aclose()
