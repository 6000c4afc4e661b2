"""Notifications: what happened, posted to the `notify:` targets (webhooks, ntfy), off the
request path.

The gateway's events (`app.events.EventLog`) are mapped to notification events (a
`vram_yield` is `yield`, a backend's state `failed` is `backend_failed`, the sleep guard's
stop is `sleep_guard`...) and queued; `notify()` never waits: a full queue drops the
notification (counted). One owned task
posts them, one at a time, each with its target's timeout and up to `ATTEMPTS` tries
(backoff doubling from `BACKOFF_S`); a 5xx, 429 or a transport error is retried, any other
4xx is not. Every outcome is counted in `microscheduler_notifications_total{result}`,
logged when it fails, and shown in `/status` (`notifications`).

What is sent: the event, its time, a line of text and the event's own fields (backend,
host, key *names*, reasons, MiB), never a request body, a key or a target's URL.
Formats: `json` (a JSON object) and `ntfy` (the text as the body, `Title`, `Tags` and
`Priority` headers, as ntfy's publish API reads them).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from app.jsonwire import json_bytes
from app.metrics import Declare
from app.settings.notify import NotifyTarget
from app.tasks import cancel_and_wait, spawn
from app.upstreams.control_http import AsyncBaseTransport, AsyncClient, HTTPError, async_client

logger = logging.getLogger(__name__)

QUEUE_SIZE: Final = 256
# Carries the gateway's `Notifier.token` on every post; an admin route refuses a request
# bearing it (a target that is the gateway by another name or through a proxy), which
# would otherwise act and notify again, in a loop (`app.api.deps.require_admin`).
LOOP_HEADER: Final = "x-microscheduler-notification"
ATTEMPTS: Final = 4
BACKOFF_S: Final = 0.5
FALLBACK_EVERY_S: Final = 3600.0  # fallback_to_cloud: the first per key per hour
RESULTS: Final = ("sent", "retried", "failed", "dropped")
_TAGS: Final = {
    "yield": "arrow_down",
    "restore": "arrow_up",
    "auto_yield": "video_game",
    "fallback_to_cloud": "cloud",
    "budget_80": "warning",
    "budget_exhausted": "no_entry",
    "backend_failed": "rotating_light",
    "sleep_guard": "warning",
    "config_reloaded": "gear",
}
_HIGH: Final = frozenset({"backend_failed", "budget_exhausted"})
Clock = Callable[[], float]


def from_event(event: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The notification an event of the log is (name, fields), or None."""
    kind = event.get("kind")
    fields = {k: v for k, v in event.items() if k not in ("seq", "at", "kind")}
    if kind == "vram_yield":
        return "yield", fields
    if kind == "vram_restore":
        return "restore", fields
    if kind == "auto_yield":
        return "auto_yield", fields
    if kind == "backend_state" and fields.get("state") == "failed":
        return "backend_failed", fields
    if kind == "config_reload" and fields.get("result") == "ok":
        return "config_reloaded", fields
    if kind in ("fallback_to_cloud", "budget_80", "budget_exhausted", "sleep_guard"):
        return str(kind), fields
    return None


def text_of(event: str, fields: dict[str, Any]) -> str:
    """One line saying what happened."""
    parts = [f"{k}={_plain(v)}" for k, v in fields.items() if v not in (None, "", [], {})]
    return f"{event}: {', '.join(parts)}" if parts else event


def _plain(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items()) or "-"
    return str(value)


def where(target: NotifyTarget) -> str:
    """How a target is named in logs and /status: its host, never its path or query."""
    return urlsplit(target.resolved_url()).hostname or "?"


@dataclass
class _Counts:
    sent: int = 0
    failed: int = 0
    last_error: str | None = None
    last_at: float | None = None


@dataclass(frozen=True)
class _Item:
    target: NotifyTarget  # itself, not its place in the list: a reload may reorder it
    event: str
    at: float
    fields: dict[str, Any]


class Notifier:
    def __init__(
        self,
        targets: Sequence[NotifyTarget],
        registry: CollectorRegistry,
        *,
        transport: AsyncBaseTransport | None = None,
        clock: Clock = time.monotonic,
        backoff_s: float = BACKOFF_S,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._targets = tuple(targets)
        self._transport = transport
        self.clock = clock  # monotonic; tests move it (fallback_to_cloud per hour)
        self._backoff_s = backoff_s
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(queue_size)
        self._counts = {target: _Counts() for target in self._targets}
        self._dropped = 0
        self._seen: dict[tuple[str, str], float] = {}
        self._task: asyncio.Task[None] | None = None
        # Sent with every post: a post that reaches this gateway back is refused.
        self.token = secrets.token_hex(8)
        self.total = Declare(registry).counter(
            "notifications",
            "Notifications to the notify targets, by result: sent, retried (an attempt "
            "failed, another follows), failed (every attempt did), dropped (queue full).",
            ("result",),
        )
        for result in RESULTS:
            self.total.labels(result)

    def configure(self, targets: Sequence[NotifyTarget]) -> None:
        """New targets (a reload). A notification queued before goes to the target it was
        queued for if the reload kept that target (wherever it now stands in the list), to
        none if it removed it; a target kept keeps its counts, a new one starts at 0."""
        self._targets = tuple(targets)
        self._counts = {t: self._counts.get(t) or _Counts() for t in self._targets}

    # -- in -----------------------------------------------------------------------------

    def on_event(self, event: dict[str, Any]) -> None:
        """An event of the log (`EventLog.listen`)."""
        found = from_event(event)
        if found is not None:
            self.notify(found[0], **found[1])

    def notify(self, event: str, **fields: Any) -> None:
        """Queue `event` for every target that wants it; never waits."""
        now = time.time()
        for index, target in enumerate(self._targets):
            if event not in target.events:
                continue
            try:
                self._queue.put_nowait(_Item(target, event, now, dict(fields)))
            except asyncio.QueueFull:
                self._dropped += 1
                self.total.labels("dropped").inc()
                logger.warning("notification dropped: queue full event=%s target=%d", event, index)

    def first_this_hour(self, key: str) -> bool:
        """Whether a fallback to the cloud of client key `key` is its first this hour
        (then it is remembered): `fallback_to_cloud` is said once per key per hour."""
        now = self.clock()
        last = self._seen.get(("fallback_to_cloud", key))
        if last is not None and now - last < FALLBACK_EVERY_S:
            return False
        self._seen[("fallback_to_cloud", key)] = now
        return True

    # -- out ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = spawn(self._run(), name="notifications")

    async def close(self) -> None:
        await cancel_and_wait(self._task)

    async def drained(self) -> None:
        """Wait until every queued notification was sent or given up (tests)."""
        await self._queue.join()

    async def _run(self) -> None:
        async with async_client(timeout=10.0, transport=self._transport) as client:
            while True:
                item = await self._queue.get()
                try:
                    if item.target in self._counts:  # not removed by a reload since
                        await self._deliver(client, item)
                finally:
                    self._queue.task_done()

    async def _deliver(self, client: AsyncClient, item: _Item) -> None:
        target = item.target
        counts = self._counts[target]
        host = where(target)
        error: str | None = "?"
        for attempt in range(1, ATTEMPTS + 1):
            error, retry = await self._post(client, target, item)
            if error is None:
                counts.sent += 1
                counts.last_at = time.time()
                self.total.labels("sent").inc()
                return
            if not retry or attempt == ATTEMPTS:
                break
            self.total.labels("retried").inc()
            logger.info("notification retried event=%s host=%s attempt=%d error=%s",
                        item.event, host, attempt, error)  # fmt: skip
            await asyncio.sleep(self._backoff_s * 2 ** (attempt - 1))
        counts.failed += 1
        counts.last_error = error
        self.total.labels("failed").inc()
        logger.warning("notification failed event=%s host=%s error=%s",
                       item.event, host, error)  # fmt: skip

    async def _post(
        self, client: AsyncClient, target: NotifyTarget, item: _Item
    ) -> tuple[str | None, bool]:
        """(None, _) when sent; else (why, whether to try again)."""
        text = text_of(item.event, item.fields)
        if target.format == "ntfy":
            headers = {
                "Title": f"microscheduler: {item.event}",
                "Tags": _TAGS.get(item.event, "bell"),
                "Priority": "high" if item.event in _HIGH else "default",
                "content-type": "text/plain; charset=utf-8",
            }
            body = text.encode()
        else:
            headers = {"content-type": "application/json"}
            payload = {"event": item.event, "at": round(item.at, 3), "text": text, **item.fields}
            body = json_bytes(payload, default=str)
        headers[LOOP_HEADER] = self.token
        try:
            response = await client.post(
                target.resolved_url(), content=body, headers=headers, timeout=target.timeout_s
            )
        except HTTPError as exc:
            return type(exc).__name__, True
        if response.status_code < 300:
            return None, False
        retry = response.status_code >= 500 or response.status_code == 429
        return f"HTTP {response.status_code}", retry

    def view(self) -> dict[str, Any]:
        """What `/status` shows: per target its host, format, events and results."""
        return {
            "queued": self._queue.qsize(),
            "dropped": self._dropped,
            "targets": [
                {
                    "index": index,
                    "host": where(target),
                    "format": target.format,
                    "events": list(target.events),
                    "sent": counts.sent,
                    "failed": counts.failed,
                    "last_error": counts.last_error,
                    "last_sent_at": counts.last_at,
                }
                for index, target in enumerate(self._targets)
                for counts in (self._counts[target],)
            ],
        }
