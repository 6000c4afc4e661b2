"""A backend's queue: the order held requests are served in (pure: priorities, aging, fair
turns between keys), and `max_inflight`, priorities, cancellation, timeouts and collation
during a drain on a Backend with a gated fake runtime."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app.errors import BackendUnavailable
from app.lifecycle import request_holds as holding
from app.lifecycle.backend import Backend
from app.lifecycle.key_turns import KeyShare
from app.lifecycle.lease import Lease, wait_without_owning
from app.lifecycle.metrics import LifecycleMetrics as Metrics
from app.lifecycle.queue import Ticket, TicketQueue, next_ticket, serve_order
from app.lifecycle.state import BackendState, StopReason
from app.settings.keys import Priority
from tests.fakes.waits import until
from tests.unit.lifecycle.test_backend_lifecycle import LAZY, GatedRuntime, make_backend, state_of

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW

# -- the order (pure) ----------------------------------------------------------------------


def ticket(priority: Priority, seq: int, arrived: float, wait_s: float = 120) -> Ticket:
    return Ticket(priority.rank, seq, arrived, aged_at=arrived + wait_s / 2)


def test_tickets_go_by_priority_then_arrival() -> None:
    tickets = [
        ticket(LOW, 1, 0.0),
        ticket(NORMAL, 2, 0.1),
        ticket(HIGH, 3, 0.2),
        ticket(HIGH, 4, 0.3),
    ]
    order = sorted(tickets, key=lambda t: serve_order(t, 1.0))
    assert [t.seq for t in order] == [3, 4, 2, 1]


def test_a_ticket_older_than_the_bound_goes_before_newer_higher_ones() -> None:
    low = ticket(LOW, 1, 0.0)
    high = ticket(HIGH, 2, 50.0)
    assert next_ticket([low, high], now=59.9) is high
    assert next_ticket([low, high], now=60.0) is low


def test_aged_tickets_go_oldest_first_whatever_their_priority() -> None:
    low = ticket(LOW, 1, 0.0)
    high = ticket(HIGH, 2, 1.0)
    assert next_ticket([high, low], now=100.0) is low
    assert next_ticket([], now=100.0) is None


def test_a_ticket_ages_at_half_its_own_wait_a_chains_shorter_one_sooner() -> None:
    # A fallback chain waits 10 s for the backend, its max_wait_s is 120: the low ticket
    # must go first after 5 s, not 60, or it times out before it ever ages.
    low = ticket(LOW, 1, 0.0, wait_s=10)
    high = ticket(HIGH, 2, 4.0)
    assert next_ticket([low, high], now=4.9) is high
    assert next_ticket([low, high], now=5.0) is low


# -- fair turns between keys of one priority (pure) --------------------------------------------


def queue_of(*floods: tuple[str, int, int], now: float = 0.0) -> TicketQueue:
    """A queue holding, in order, `count` tickets of each (key, weight, count)."""
    queue = TicketQueue("b", Metrics())
    return flood(queue, *floods, now=now)


def flood(queue: TicketQueue, *floods: tuple[str, int, int], now: float = 0.0) -> TicketQueue:
    for name, weight, count in floods:
        for _ in range(count):
            queue.enter(NORMAL, 120, now=now, share=KeyShare(name, weight))
    return queue


def served(queue: TicketQueue, slots: int | None = None, now: float = 1.0) -> list[str]:
    """The keys of the next `slots` tickets served (None: until the queue is empty)."""
    order: list[str] = []
    while slots is None or len(order) < slots:
        ticket = queue.take_first(now)
        if ticket is None:
            break
        order.append(ticket.share.name)
    return order


def test_a_key_that_sent_after_a_flood_is_served_within_the_next_few_slots() -> None:
    # Key a floods 100 requests, key b sends 5 after them: each of b's is served within
    # the next few slots (a and b take turns), not after a's 100.
    queue = queue_of(("a", 1, 100))
    assert served(queue, 3) == ["a", "a", "a"]  # a alone: its own order
    flood(queue, ("b", 1, 5), now=0.5)
    order = served(queue)
    assert [i for i, key in enumerate(order) if key == "b"] == [1, 3, 5, 7, 9]
    assert order.count("a") == 97  # nothing lost: a's flood goes on after


def test_a_key_of_weight_2_gets_two_turns_to_one() -> None:
    queue = queue_of(("a", 2, 40), ("b", 1, 40))
    first = served(queue, 30)
    assert (first.count("a"), first.count("b")) == (20, 10)
    assert first[:6] == ["a", "b", "a", "a", "b", "a"]


@pytest.mark.parametrize(("weights", "rounds"), [
    ((3, 2), "baaba"),
    ((7, 5), "baababaababa"),
    ((10, 1), "b" + "a" * 10),  # 10 x 1/10 is not 1 in floats: counted exactly, it is
])  # fmt: skip
def test_turns_follow_the_weights_exactly(weights: tuple[int, int], rounds: str) -> None:
    # Each round the keys have had their weights' turns and tie again: b, first in, goes.
    queue = queue_of(("b", weights[1], 50), ("a", weights[0], 50))
    assert "".join(served(queue, 2 * len(rounds))) == rounds * 2


def test_an_idle_key_does_not_bank_turns() -> None:
    # b was served 5 times, then idle while a had 20 slots: when b comes back it takes
    # turns with a, not 15 slots in a row to catch up.
    queue = queue_of(("a", 1, 30), ("b", 1, 5))
    assert served(queue, 10).count("b") == 5
    assert served(queue, 10) == ["a"] * 10  # b idle: its virtual time stays behind
    flood(queue, ("b", 1, 10), now=0.5)
    assert served(queue, 6) == ["a", "b", "a", "b", "a", "b"]


def test_turns_start_again_once_the_queue_is_empty() -> None:
    queue = queue_of(("a", 1, 10))
    assert served(queue) == ["a"] * 10
    flood(queue, ("b", 1, 3), ("a", 1, 3))  # a's 10 earlier turns are not held against it
    assert served(queue) == ["b", "a", "b", "a", "b", "a"]


def test_priorities_and_aging_still_come_before_turns() -> None:
    queue = TicketQueue("b", Metrics())
    for _ in range(3):
        queue.enter(LOW, 120, now=0.0, share=KeyShare("low"))
    old = queue.enter(NORMAL, 10, now=0.0, share=KeyShare("a"))  # ages at 5.0
    for _ in range(3):
        queue.enter(NORMAL, 120, now=0.0, share=KeyShare("a"))
    queue.enter(HIGH, 120, now=1.0, share=KeyShare("high"))
    queue.enter(NORMAL, 120, now=1.0, share=KeyShare("b"))
    assert queue.take_first(6.0) is old  # aged: first, whatever the turns
    assert served(queue, now=6.0) == ["high", "b", "a", "a", "a", "low", "low", "low"]


# -- on a backend -----------------------------------------------------------------------------


def waiting_gauge(metrics: Metrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value(
        "microscheduler_requests_waiting", {"backend": "b", "reason": reason}
    )


async def ready(runtime: GatedRuntime, metrics: Metrics | None = None, **config: Any) -> Backend:
    runtime.gate.set()
    backend = make_backend(runtime, metrics=metrics or Metrics(), **LAZY, **config)
    await backend.start()
    return backend


def acquire(backend: Backend, priority: Priority = NORMAL) -> asyncio.Task[Lease]:
    return asyncio.create_task(backend.requests.acquire(priority=priority))


async def test_beyond_max_inflight_a_request_waits_counted_until_a_slot_frees() -> None:
    metrics = Metrics()
    backend = await ready(GatedRuntime(), metrics, max_inflight=1)
    assert waiting_gauge(metrics, "max_inflight") == 0  # declared before any traffic
    first = await backend.requests.acquire()
    second = acquire(backend)
    await until(lambda: backend.requests.queued == 1, what="the second request queued for a slot")
    assert not second.done()
    assert (backend.requests.in_flight, backend.requests.waiting) == (1, 1)
    assert waiting_gauge(metrics, "max_inflight") == 1
    assert waiting_gauge(metrics, "wake") == 0
    first.release()
    lease = await asyncio.wait_for(second, 5)
    assert (backend.requests.in_flight, backend.requests.waiting, backend.requests.queued) == (
        1,
        0,
        0,
    )
    assert waiting_gauge(metrics, "max_inflight") == 0
    lease.release()
    assert backend.requests.in_flight == 0


async def test_a_high_priority_request_queued_after_a_low_one_is_served_first() -> None:
    backend = await ready(GatedRuntime(), max_inflight=1)
    held = await backend.requests.acquire()
    low = acquire(backend, LOW)
    await until(lambda: backend.requests.queued == 1, what="the low request queued")
    high = acquire(backend, HIGH)
    await until(lambda: backend.requests.queued == 2, what="the high request queued")
    held.release()
    first = await asyncio.wait_for(high, 5)
    assert not low.done()
    first.release()
    (await asyncio.wait_for(low, 5)).release()
    assert backend.requests.in_flight == 0


async def test_a_low_request_older_than_half_max_wait_s_beats_a_newer_high_one() -> None:
    backend = await ready(GatedRuntime(), max_inflight=1, max_wait_s=0.6)
    held = await backend.requests.acquire()
    low = acquire(backend, LOW)
    await until(lambda: backend.requests.queued == 1, what="the low request queued")
    queued_at = time.monotonic()
    await until(lambda: time.monotonic() - queued_at > 0.35, what="the low request to age")
    high = acquire(backend, HIGH)
    await until(lambda: backend.requests.queued == 2, what="the high request queued")
    held.release()
    first = await asyncio.wait_for(low, 5)
    assert not high.done()
    first.release()
    (await asyncio.wait_for(high, 5)).release()


async def test_requests_held_while_a_lazy_backend_wakes_are_served_in_queue_order() -> None:
    runtime = GatedRuntime()
    metrics = Metrics()
    backend = make_backend(runtime, metrics=metrics, max_inflight=1, **LAZY)
    low = acquire(backend, LOW)
    await until(lambda: backend.requests.waiting == 1, what="the low request held by the start")
    normal = acquire(backend, NORMAL)
    high = acquire(backend, HIGH)
    await until(lambda: backend.requests.waiting == 3, what="three requests held by the start")
    assert waiting_gauge(metrics, "wake") == 3
    assert backend.requests.queued == 0
    runtime.gate.set()
    served: list[str] = []
    for name, task in (("high", high), ("normal", normal), ("low", low)):
        lease = await asyncio.wait_for(task, 5)
        served.append(name)
        assert backend.requests.in_flight == 1
        lease.release()
    assert served == ["high", "normal", "low"]
    assert runtime.starts == 1
    assert (waiting_gauge(metrics, "wake"), waiting_gauge(metrics, "max_inflight")) == (0, 0)


async def test_a_queued_request_that_goes_away_leaves_no_ticket_and_no_lease() -> None:
    metrics = Metrics()
    backend = await ready(GatedRuntime(), metrics, max_inflight=1)
    held = await backend.requests.acquire()
    gone = acquire(backend)
    await until(lambda: backend.requests.queued == 1, what="the request queued")
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert (backend.requests.waiting, backend.requests.queued, backend.requests.in_flight) == (
        0,
        0,
        1,
    )
    assert waiting_gauge(metrics, "max_inflight") == 0
    held.release()
    assert backend.requests.in_flight == 0


async def test_a_request_granted_a_slot_as_it_goes_away_gives_the_slot_back() -> None:
    backend = await ready(GatedRuntime(), max_inflight=1)
    held = await backend.requests.acquire()
    gone = acquire(backend, HIGH)
    later = acquire(backend, LOW)
    await until(lambda: backend.requests.queued == 2, what="two requests queued")
    held.release()  # granted to `gone` at once, before it runs again
    assert backend.requests.in_flight == 1
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    lease = await asyncio.wait_for(later, 5)  # the slot went on to the next in line
    assert (backend.requests.in_flight, backend.requests.waiting) == (1, 0)
    lease.release()
    assert backend.requests.in_flight == 0


async def test_a_slot_wait_longer_than_max_wait_s_is_a_503_naming_max_inflight() -> None:
    metrics = Metrics()
    backend = await ready(GatedRuntime(), metrics, max_inflight=1, max_wait_s=0.05)
    held = await backend.requests.acquire()
    with pytest.raises(BackendUnavailable) as info:
        await backend.requests.acquire()
    assert info.value.status == 503
    assert info.value.kind == "queue_full"
    assert info.value.headers == {"retry-after": "5"}
    assert "no free slot after 0.05s (max_wait_s): max_inflight 1" in info.value.message
    assert (backend.requests.waiting, backend.requests.in_flight) == (0, 1)
    assert waiting_gauge(metrics, "max_inflight") == 0
    held.release()


async def test_a_slot_granted_as_the_deadline_passes_is_handed_over_not_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = await ready(GatedRuntime(), max_inflight=1, max_wait_s=0.05)
    held = await backend.requests.acquire()

    async def deadline_then_grant(*args: Any, **kwargs: Any) -> bool:
        done = await wait_without_owning(*args, **kwargs)
        held.release()  # the slot frees (and is granted) just as the deadline passes
        return done

    monkeypatch.setattr(holding, "wait_without_owning", deadline_then_grant)
    lease = await backend.requests.acquire()
    assert (backend.requests.in_flight, backend.requests.waiting) == (1, 0)
    lease.release()
    assert backend.requests.in_flight == 0


async def test_a_request_waiting_for_a_slot_is_told_why_every_wake_notice_interval() -> None:
    runtime = GatedRuntime()
    runtime.gate.set()
    backend = make_backend(runtime, wake_notice_s=0.01, max_inflight=1, **LAZY)
    await backend.start()
    held = await backend.requests.acquire()
    notices: list[str | None] = []

    async def notice(waited_s: float, detail: str | None) -> None:
        notices.append(detail)
        if len(notices) == 2:
            held.release()

    (await asyncio.wait_for(backend.requests.acquire(notice), 5)).release()
    assert notices == ["queued for a slot, max_inflight 1"] * 2


async def test_max_waiting_bounds_the_requests_queued_for_a_slot() -> None:
    backend = await ready(GatedRuntime(), max_inflight=1, max_waiting=1)
    held = await backend.requests.acquire()
    queued = acquire(backend)
    await until(lambda: backend.requests.queued == 1, what="one request queued")
    with pytest.raises(BackendUnavailable) as info:
        await backend.requests.acquire()
    assert info.value.kind == "queue_full"
    assert "1 waiting requests (max_waiting)" in info.value.message
    held.release()
    (await asyncio.wait_for(queued, 5)).release()


async def test_a_slot_waiter_hears_at_once_that_its_backend_failed() -> None:
    runtime = GatedRuntime()
    backend = await ready(runtime, max_inflight=1)
    held = await backend.requests.acquire()
    waiter = acquire(backend)
    await until(lambda: backend.requests.queued == 1, what="the request queued")
    runtime.code = 137
    await backend.watcher.watch()
    assert backend.state is BackendState.FAILED
    with pytest.raises(BackendUnavailable) as info:
        await asyncio.wait_for(waiter, 5)  # not after max_wait_s (120 s)
    assert "exited with code 137" in info.value.message
    held.release()


async def test_a_stop_serves_the_requests_queued_before_it_then_stops() -> None:
    runtime = GatedRuntime()
    backend = await ready(runtime, max_inflight=1)
    held = await backend.requests.acquire()
    first = acquire(backend, LOW)
    second = acquire(backend, HIGH)
    await until(lambda: backend.requests.queued == 2, what="two requests queued")
    stopping = asyncio.create_task(backend.stop(StopReason.EVICTION))
    await until(lambda: backend.state is BackendState.STOPPING, what="the stop to begin")
    later = acquire(backend)  # arrives after the stop began: waits for it
    await until(lambda: backend.requests.waiting == 3, what="the later request held")
    held.release()
    lease = await asyncio.wait_for(second, 5)  # queue order still holds in the drain
    assert state_of(backend) is BackendState.STOPPING
    assert runtime.stops == 0
    lease.release()
    lease = await asyncio.wait_for(first, 5)
    assert runtime.stops == 0  # the drain waits for the collated requests too
    assert not later.done()
    lease.release()
    await asyncio.wait_for(stopping, 5)
    assert runtime.stops == 1
    lease = await asyncio.wait_for(later, 5)  # then started the backend again
    assert state_of(backend) is BackendState.READY
    assert runtime.starts == 2
    lease.release()


async def test_collation_is_bounded_by_the_drain_timeout() -> None:
    runtime = GatedRuntime()
    metrics = Metrics()
    backend = await ready(runtime, metrics, max_inflight=1, drain_timeout_s=0.05)
    held = await backend.requests.acquire()  # never released in time
    queued = acquire(backend)
    await until(lambda: backend.requests.queued == 1, what="the request queued")
    await backend.stop(StopReason.IDLE)
    assert runtime.stops == 1
    assert (
        metrics.registry.get_sample_value("microscheduler_drain_timeouts_total", {"backend": "b"})
        == 1
    )
    # The request it could not serve waits for the stop like a later one, and starts it.
    held.release()
    lease = await asyncio.wait_for(queued, 5)
    assert runtime.starts == 2
    lease.release()


async def test_without_max_inflight_nothing_queues_on_a_ready_backend() -> None:
    backend = await ready(GatedRuntime())
    leases = [await backend.requests.acquire(priority=LOW) for _ in range(20)]
    assert (backend.requests.in_flight, backend.requests.waiting) == (20, 0)
    for lease in leases:
        lease.release()
