"""`app.notify.notifier`: a queued notification goes to the target it was queued for,
whatever a reload does to the list of targets in the meantime."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry

from app.notify.notifier import Notifier
from app.settings.notify import NotifyTarget

A = NotifyTarget(url="http://a.example/hook", events=("yield",))
B = NotifyTarget(url="http://b.example/hook", events=("restore",))
C = NotifyTarget(url="http://c.example/hook")
E = NotifyTarget(url="http://e.example/hook")


class Receivers(httpx.AsyncBaseTransport):
    """Answers every post 200 and keeps (host, event) of each."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        event = httpx.Response(200, content=request.content).json()["event"]
        self.posts.append((request.url.host, event))
        return httpx.Response(200)


async def deliver_queued(notifier: Notifier) -> None:
    """Start the notifier, wait until what is queued is delivered, and close it."""
    notifier.start()
    try:
        await notifier.drained()
    finally:
        await notifier.close()


async def test_a_notification_queued_before_a_reload_that_reorders_goes_to_its_target() -> None:
    receivers = Receivers()
    notifier = Notifier([A, B], CollectorRegistry(), transport=receivers)
    notifier.notify("yield", reason="gaming")  # for A only (B wants restores)
    notifier.configure([B, A])  # a reload: the same targets, in another order
    await deliver_queued(notifier)
    # Queued by index, it went to B (the new first target), which never asked for yields.
    assert receivers.posts == [("a.example", "yield")]
    view = {t["host"]: t["sent"] for t in notifier.view()["targets"]}
    assert view == {"a.example": 1, "b.example": 0}


async def test_after_a_reload_only_targets_kept_get_what_was_queued_before() -> None:
    receivers = Receivers()
    notifier = Notifier([A, C], CollectorRegistry(), transport=receivers)
    notifier.notify("yield", reason="gaming")  # for A and C
    notifier.configure([C, E])  # A removed, C first, E added
    await deliver_queued(notifier)
    # By index, A's went to C and C's to E, which did not exist when it was queued.
    assert receivers.posts == [("c.example", "yield")]


async def test_counts_of_a_target_the_reload_kept_go_on() -> None:
    receivers = Receivers()
    notifier = Notifier([A], CollectorRegistry(), transport=receivers)
    notifier.start()
    try:
        notifier.notify("yield")
        await notifier.drained()
        notifier.configure([C, A])
        notifier.notify("yield")
        await notifier.drained()
    finally:
        await notifier.close()
    view = {t["host"]: t["sent"] for t in notifier.view()["targets"]}
    assert view == {"c.example": 1, "a.example": 2}
