"""`GET /status/stream` (admin): the live `/status` as server-sent events.

First a `snapshot` event (the whole `/status` document), then on every change an event
named for what changed, with the section whole: `backends`, `gpu`, `host_ram`, `holds`,
`profile`, `fallback`, `keys`, `state`, `schedules` (each window: active, next edge,
overridden), `config` (the configuration running: hash, when and how it was loaded),
`hosts` when models.yaml has `hosts:` (every host's GPUs, RAM and holds, the local one's
also in `gpu`, `host_ram` and `holds`), and `event` (one new entry of the event log,
with its `seq`). State sections are pushed at most every `MIN_INTERVAL_S`: a burst of
changes (requests starting and ending) becomes one push. Ages (`age_s`: how old the GPU's
or the host RAM's last reading is, and `last_success_wall`) move by themselves and are no
change: every 15 s of quiet the sections whose ages moved are sent again, then a comment
`: keep-alive`.

The gateway never waits for a client: changes only mark the client's subscription
(`app.events`); its own task builds and sends what changed. A client that stops reading
while `MAX_QUEUED` events pile up is dropped: a last `dropped` event is attempted and the
stream ends. When the gateway begins to stop (SIGTERM or SIGINT), every stream gets a
`shutdown` event and ends, so an open page does not hold the shutdown for its whole grace.
Reconnecting starts again with a snapshot.

    curl -N localhost:8080/status/stream
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Final

from fastapi import APIRouter
from starlette.responses import StreamingResponse

from app.api.deps import AdminDep, ServicesDep
from app.api.views import status_view
from app.events import Subscription
from app.jsonwire import sse_event
from app.services import Services

router = APIRouter(tags=["ops"])

KEEPALIVE_S: Final = 15.0
MIN_INTERVAL_S: Final = 0.1
SECTIONS: Final = (
    "backends", "gpu", "host_ram", "holds", "profile", "fallback", "keys", "state",
    "schedules", "config",
)  # fmt: skip
# Keys that move by themselves (at any depth): a reading's age, and when the last one
# was taken (a poll that read the same values is no change).
VOLATILE: Final = frozenset({"age_s", "last_success_wall"})


@router.get("/status/stream", dependencies=[AdminDep])
async def status_stream(services: ServicesDep) -> StreamingResponse:
    subscription = services.events.subscribe()
    return StreamingResponse(
        _stream(services, subscription),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


def sse(event: str, data: Any) -> bytes:
    return sse_event(event, data, default=str)


def steady(value: Any) -> Any:
    """`value` without its `VOLATILE` keys: what counts as a change."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [steady(v) for v in value]
    return value


async def _stream(services: Services, sub: Subscription) -> AsyncGenerator[bytes, None]:
    try:
        status = status_view(services)
        sub.take()  # the snapshot holds every event so far: send only later ones
        # `hosts` only when there is another host: the local one is `gpu` and `holds` already.
        sections = SECTIONS if len(services.hosts) == 1 else (*SECTIONS, "hosts")
        sent = {section: status[section] for section in sections}
        same = {section: steady(value) for section, value in sent.items()}  # sent, ages out
        yield sse("snapshot", status)
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    await sub.wake.wait()
            except TimeoutError:
                status = status_view(services)
                for section in sections:  # ages that moved (or a change that woke no one)
                    if status[section] != sent[section]:
                        sent[section], same[section] = status[section], steady(status[section])
                        yield sse(section, status[section])
                yield b": keep-alive\n\n"
                continue
            if sub.dropped:
                yield sse("dropped", {"reason": "the client fell too far behind"})
                return
            if sub.ended is not None:
                yield sse("shutdown", {"reason": sub.ended})
                return
            for event in sub.take():
                yield sse("event", event)
            status = status_view(services)
            for section in sections:
                now = steady(status[section])
                if now != same[section]:
                    sent[section], same[section] = status[section], now
                    yield sse(section, status[section])
            await asyncio.sleep(MIN_INTERVAL_S)
    finally:
        sub.close()
