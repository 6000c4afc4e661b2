"""VRAM admission and zones: the arbiter with real `Backend`s, gated fake runtimes and the
simulated GPU probe (whose used memory is what the gateway placed). No processes, no sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from app.errors import BackendUnavailable, Conflict, InvalidRequest
from app.gpu.poller import GpuMonitor
from app.gpu.sim import SimSource
from app.lifecycle.backend import Backend
from app.lifecycle.metrics import LifecycleMetrics as Metrics
from app.lifecycle.state import BackendState, StopReason
from app.lifecycle.store import StateStore
from app.settings import BackendConfig, ProcessRuntimeConfig, TimeoutsConfig
from app.upstreams.http import HttpUpstream
from app.upstreams.vllm import VllmClient
from app.vram.arbiter import VramArbiter, ZoneGrant
from app.vram.zones import Zone
from tests.fakes.runtimes import FakeRuntime
from tests.fakes.waits import until

TOTAL_MIB = 24000
T = TypeVar("T")


class Health:
    """A backend's server as its start sees it: `/health` answers 200 once `gate` is open,
    `/openapi.json` (what a start learns after health, before ready) once `learn_gate` is;
    both open by default. `learning` is set when `/openapi.json` is asked."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.called = asyncio.Event()
        self.learn_gate = asyncio.Event()
        self.learn_gate.set()
        self.learning = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi.json":
            self.learning.set()
            await self.learn_gate.wait()
            return httpx.Response(404)  # docs off: nothing learned, nothing to parse
        self.called.set()
        await self.gate.wait()
        return httpx.Response(200)


class Rig:
    """An arbiter over a simulated GPU, a state directory and the backends added to it."""

    def __init__(self, state_dir: Path, *, total_mib: int, count: int) -> None:
        self.metrics = Metrics()
        self.store = StateStore(state_dir)
        self.backends: dict[str, Backend] = {}
        self.runtimes: dict[str, FakeRuntime] = {}
        self.health: dict[str, Health] = {}
        self._clients: list[httpx.AsyncClient] = []
        gpus = GpuMonitor(
            SimSource(total_mib, count, self.placed), poll_interval_s=1.0, stale_after_s=10.0
        )
        self.arbiter = VramArbiter(gpus, self.store, reclaim_timeout_s=5.0, metrics=self.metrics)
        self.arbiter.attach(self.backends)  # the same dict: backends added later count

    def placed(self) -> dict[int, int]:
        return self.arbiter.placed_mib()

    def add(
        self,
        name: str,
        *,
        vram_mib: int,
        priority: int = 50,
        pinned: bool = False,
        gpus: Sequence[int] = (0,),
        **fields: Any,
    ) -> Backend:
        config = BackendConfig(
            url=f"http://{name}:8000",
            models=[name],
            runtime=ProcessRuntimeConfig(kind="process", command=["serve", name]),
            lifecycle="pinned" if pinned else "lazy",
            priority=priority,
            vram_mib=vram_mib,
            gpus=list(gpus),
            **fields,
        )
        runtime = FakeRuntime()
        health = Health()
        client = httpx.AsyncClient(transport=httpx.MockTransport(health))
        self._clients.append(client)
        backend = Backend(
            name,
            config,
            runtime,
            HttpUpstream(name, config.url, TimeoutsConfig()),
            VllmClient(client, config.url),
            self.metrics,
            admission=self.arbiter,
        )
        self.backends[name] = backend
        self.runtimes[name] = runtime
        self.health[name] = health
        return backend

    async def ready(
        self,
        name: str,
        *,
        vram_mib: int,
        priority: int = 50,
        pinned: bool = False,
        **fields: Any,
    ) -> Backend:
        """Add a backend and start it (admission included); it must end ready."""
        backend = self.add(name, vram_mib=vram_mib, priority=priority, pinned=pinned, **fields)
        await within(backend.start())
        assert state_of(backend) is BackendState.READY
        return backend

    def stops(self, backend: str, reason: str) -> float | None:
        return self.metrics.registry.get_sample_value(
            "microscheduler_backend_stops_total", {"backend": backend, "reason": reason}
        )

    async def zone(
        self, mib: int, *, name: str = "comfy", holder: str = "comfyui", ttl_s: float | None = 600
    ) -> ZoneGrant:
        return await within(
            self.arbiter.acquire_zone(
                name, holder=holder, mib=mib, gpu=0, ttl_s=ttl_s, below_priority=None
            )
        )

    async def close(self) -> None:
        for backend in self.backends.values():
            await backend.abandon()
        for client in self._clients:
            await client.aclose()


class Rigs:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._made: list[Rig] = []

    def make(self, *, total_mib: int = TOTAL_MIB, count: int = 1) -> Rig:
        rig = Rig(self.state_dir, total_mib=total_mib, count=count)
        self._made.append(rig)
        return rig

    async def close(self) -> None:
        for rig in self._made:
            await rig.close()


@pytest.fixture
async def rigs(tmp_path: Path) -> AsyncIterator[Rigs]:
    made = Rigs(tmp_path / "state")
    yield made
    await made.close()


@pytest.fixture
def rig(rigs: Rigs) -> Rig:
    return rigs.make()


def state_of(backend: Backend) -> BackendState:
    # A fresh read, so the type checker does not carry an earlier narrowing over an await.
    return backend.state


async def settle(rounds: int = 100) -> None:
    """Let every runnable task run as far as it can without anything from outside."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def within(awaitable: Awaitable[T], seconds: float = 5.0) -> T:
    """Await what the behaviour under test should finish; a test fails, never hangs."""
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        pytest.fail(f"still waiting after {seconds:g}s")


async def unavailable(backend: Backend) -> BackendUnavailable:
    """The error a request gets from `backend`; fails the test if it gets a lease."""
    try:
        lease = await within(backend.requests.acquire())
    except BackendUnavailable as exc:
        return exc
    lease.release()
    pytest.fail(f"backend {backend.name!r} gave a lease; it is {backend.state}")


# -- admission ------------------------------------------------------------------------------


async def test_a_backend_that_fits_starts_without_eviction(rig: Rig) -> None:
    low = await rig.ready("low", vram_mib=8000, priority=10)
    high = await rig.ready("high", vram_mib=8000, priority=90)
    assert state_of(low) is BackendState.READY
    assert rig.runtimes["low"].stops == 0
    assert high.memory.holds_vram
    assert low.memory.holds_vram
    assert rig.placed() == {0: 16000}


async def test_a_backend_that_does_not_fit_evicts_a_lower_priority_idle_one(rig: Rig) -> None:
    low = await rig.ready("low", vram_mib=16000, priority=10)
    high = await rig.ready("high", vram_mib=16000, priority=50)
    assert state_of(high) is BackendState.READY
    assert state_of(low) is BackendState.STOPPED
    assert low.reason is not None
    assert low.reason.endswith("(eviction)")
    assert rig.runtimes["low"].stops == 1
    assert rig.stops("low", "eviction") == 1.0
    assert rig.placed() == {0: 16000}


async def test_a_start_that_cannot_fit_is_refused_naming_the_holders(rig: Rig) -> None:
    await rig.ready("orchestrator", vram_mib=16000, pinned=True, priority=0)
    await rig.ready("keeper", vram_mib=4000, priority=90)
    requester = rig.add("requester", vram_mib=8000, priority=50)

    with pytest.raises(BackendUnavailable) as info:
        await within(requester.start())
    assert info.value.kind == "no_vram"
    assert state_of(requester) is BackendState.STOPPED
    assert requester.reason is not None
    assert requester.reason.startswith("not enough VRAM to start: needs 8000 MiB on GPU 0")
    assert "backend orchestrator 16000 MiB (pinned)" in requester.reason
    assert "backend keeper 4000 MiB (priority 90, not below 50)" in requester.reason

    refused = await unavailable(requester)
    assert refused.kind == "no_vram"
    assert "backend orchestrator 16000 MiB (pinned)" in refused.message
    # Nothing was evicted, nothing was launched.
    assert rig.runtimes["requester"].starts == 0
    assert [rig.runtimes[n].stops for n in ("orchestrator", "keeper")] == [0, 0]
    assert state_of(rig.backends["keeper"]) is BackendState.READY
    assert rig.placed() == {0: 20000}


async def test_starts_on_one_gpu_run_one_at_a_time(rig: Rig) -> None:
    first = rig.add("first", vram_mib=8000)
    second = rig.add("second", vram_mib=8000)
    rig.runtimes["first"].start_gate.clear()
    rig.health["first"].gate.clear()

    starting = [asyncio.create_task(first.start()), asyncio.create_task(second.start())]
    await within(rig.runtimes["first"].start_called.wait())
    await settle()
    assert state_of(second) is BackendState.STARTING
    assert rig.runtimes["second"].starts == 0

    # Launched but not yet healthy (vLLM profiling memory): still alone on the GPU.
    rig.runtimes["first"].start_gate.set()
    await within(rig.health["first"].called.wait())
    await settle()
    assert rig.runtimes["second"].starts == 0

    rig.health["first"].gate.set()
    await within(starting[0])
    assert state_of(first) is BackendState.READY
    await within(starting[1])
    assert rig.runtimes["second"].starts == 1
    assert state_of(second) is BackendState.READY


async def test_starts_on_different_gpus_run_concurrently(rigs: Rigs) -> None:
    rig = rigs.make(count=2)
    on0 = rig.add("on0", vram_mib=8000, gpus=[0])
    on1 = rig.add("on1", vram_mib=8000, gpus=[1])
    for name in ("on0", "on1"):
        rig.runtimes[name].start_gate.clear()

    starting = [asyncio.create_task(on0.start()), asyncio.create_task(on1.start())]
    await within(rig.runtimes["on0"].start_called.wait())
    await within(rig.runtimes["on1"].start_called.wait())

    for name in ("on0", "on1"):
        rig.runtimes[name].start_gate.set()
    await within(asyncio.gather(*starting))
    assert rig.placed() == {0: 8000, 1: 8000}


async def test_a_backend_on_two_gpus_waits_for_a_start_on_either(rigs: Rigs) -> None:
    rig = rigs.make(count=2)
    on1 = rig.add("on1", vram_mib=8000, gpus=[1])
    wide = rig.add("wide", vram_mib=8000, gpus=[0, 1])
    rig.runtimes["on1"].start_gate.clear()

    starting = [asyncio.create_task(on1.start()), asyncio.create_task(wide.start())]
    await within(rig.runtimes["on1"].start_called.wait())
    await settle()
    assert rig.runtimes["wide"].starts == 0

    rig.runtimes["on1"].start_gate.set()
    await within(asyncio.gather(*starting))
    assert rig.runtimes["wide"].starts == 1
    assert rig.placed() == {0: 8000, 1: 16000}


async def test_evicting_a_busy_backend_waits_for_its_lease_to_drain(rig: Rig) -> None:
    victim = await rig.ready("victim", vram_mib=16000, priority=10)
    lease = await within(victim.requests.acquire())
    evictor = rig.add("evictor", vram_mib=16000, priority=50)

    starting = asyncio.create_task(evictor.start())
    await until(lambda: victim.state is BackendState.STOPPING)
    await settle()
    assert rig.runtimes["victim"].stops == 0
    assert rig.runtimes["evictor"].starts == 0
    assert state_of(evictor) is BackendState.STARTING

    lease.release()
    await within(starting)
    assert state_of(evictor) is BackendState.READY
    assert state_of(victim) is BackendState.STOPPED
    assert rig.runtimes["victim"].stops == 1
    assert rig.stops("victim", "eviction") == 1.0


async def test_a_request_to_a_backend_being_evicted_does_not_evict_the_evictor(rig: Rig) -> None:
    victim = await rig.ready("victim", vram_mib=16000, priority=10)
    rig.runtimes["victim"].stop_gate.clear()
    evictor = rig.add("evictor", vram_mib=16000, priority=50)

    starting = asyncio.create_task(evictor.start())
    await within(rig.runtimes["victim"].stop_called.wait())
    request = asyncio.create_task(victim.requests.acquire())
    await settle()
    assert not request.done()  # it waits for the stop, then decides

    rig.runtimes["victim"].stop_gate.set()
    await within(starting)
    with pytest.raises(BackendUnavailable) as info:
        await within(request)
    assert info.value.kind == "no_vram"
    assert state_of(evictor) is BackendState.READY
    assert rig.runtimes["evictor"].stops == 0
    assert rig.runtimes["victim"].starts == 1  # only its first start
    assert rig.placed() == {0: 16000}


async def test_a_start_waits_for_a_stop_in_progress_instead_of_refusing(rig: Rig) -> None:
    # Memory that a stop in progress (here an idle stop) is about to free is waited for,
    # not refused: the start proceeds once the stop is done, without evicting anything.
    going = await rig.ready("going", vram_mib=16000, priority=10)
    rig.runtimes["going"].stop_gate.clear()
    stopping = asyncio.create_task(going.stop(StopReason.IDLE))
    await within(rig.runtimes["going"].stop_called.wait())
    requester = rig.add("requester", vram_mib=16000, priority=50)

    acquiring = asyncio.create_task(requester.requests.acquire())
    await until(lambda: requester.requests.waiting == 1, what="the request to be held")
    await settle()
    assert not acquiring.done()  # waiting for the stop, neither refused nor started
    assert rig.runtimes["requester"].starts == 0
    rig.runtimes["going"].stop_gate.set()
    await within(stopping)
    lease = await within(acquiring)
    lease.release()
    assert going.reason is not None
    assert going.reason.endswith("(idle)")
    assert rig.runtimes["going"].stops == 1
    assert rig.stops("going", "eviction") == 0.0


# -- zones ----------------------------------------------------------------------------------


async def three_ready(rig: Rig) -> tuple[Backend, Backend, Backend]:
    """a (priority 10) and b (20) of 8000 MiB, c (90) of 4000 MiB: 20000 of 24000 used."""
    return (
        await rig.ready("a", vram_mib=8000, priority=10),
        await rig.ready("b", vram_mib=8000, priority=20),
        await rig.ready("c", vram_mib=4000, priority=90),
    )


async def test_a_zone_evicts_lazy_backends_and_blocks_them(rig: Rig) -> None:
    a, b, c = await three_ready(rig)

    grant = await rig.zone(18000)

    assert grant.renewed is False
    assert grant.freed_mib == 16000
    assert grant.zone.stopped == ("a", "b")
    assert (grant.zone.holder, grant.zone.gpu, grant.zone.mib) == ("comfyui", 0, 18000)
    assert rig.arbiter.book.zones == {"comfy": grant.zone}
    assert rig.placed() == {0: 4000 + 18000}
    for backend in (a, b):
        assert state_of(backend) is BackendState.STOPPED
        assert backend.reason is not None
        assert backend.reason.endswith("(zone)")
        assert rig.stops(backend.name, "zone") == 1.0
        blocked = await unavailable(backend)
        assert blocked.kind == "blocked"
        assert "VRAM zone 'comfy' (held by 'comfyui', 18000 MiB on GPU 0)" in blocked.message
        assert rig.runtimes[backend.name].starts == 1  # the request did not start it
        assert state_of(backend) is BackendState.STOPPED
    assert state_of(c) is BackendState.READY
    assert c.blocks == {}
    assert rig.store.load()["zones"] == [grant.zone.to_json()]


async def test_a_zone_holds_its_memory_against_later_starts(rig: Rig) -> None:
    await three_ready(rig)
    await rig.zone(18000)
    late = rig.add("late", vram_mib=8000, priority=50)

    refused = await unavailable(late)
    assert refused.kind == "no_vram"
    assert "zone comfy (holder comfyui) 18000 MiB" in refused.message
    assert rig.runtimes["late"].starts == 0


async def test_renewing_a_zone_extends_it_without_evicting_more(rig: Rig) -> None:
    await three_ready(rig)
    first = await rig.zone(18000, ttl_s=60)
    assert first.zone.expires_at is not None

    renewed = await rig.zone(18000, ttl_s=3600)

    assert renewed.renewed is True
    assert renewed.freed_mib == 0
    assert renewed.zone.stopped == ("a", "b")
    assert renewed.zone.granted_at == first.zone.granted_at
    assert renewed.zone.expires_at is not None
    assert renewed.zone.expires_at >= first.zone.expires_at + 3000
    assert state_of(rig.backends["c"]) is BackendState.READY
    assert rig.runtimes["c"].stops == 0
    assert rig.placed() == {0: 4000 + 18000}  # the hold is not counted twice
    assert rig.store.load()["zones"] == [renewed.zone.to_json()]


async def test_a_zone_held_by_another_holder_is_a_conflict(rig: Rig) -> None:
    await three_ready(rig)
    grant = await rig.zone(18000)

    with pytest.raises(Conflict) as info:
        await rig.zone(18000, holder="someone-else")
    assert "VRAM zone 'comfy' (held by 'comfyui'" in info.value.message
    assert rig.arbiter.book.zones == {"comfy": grant.zone}
    assert state_of(rig.backends["c"]) is BackendState.READY


async def test_releasing_a_zone_unblocks_and_the_next_request_starts_the_backend(
    rig: Rig,
) -> None:
    a, b, _ = await three_ready(rig)
    grant = await rig.zone(18000)

    assert rig.arbiter.book.release_zone("comfy") == grant.zone

    assert a.blocks == {}
    assert b.blocks == {}
    assert rig.arbiter.book.zones == {}
    assert rig.store.load()["zones"] == []
    assert rig.placed() == {0: 4000}
    lease = await within(a.requests.acquire())
    lease.release()
    assert state_of(a) is BackendState.READY
    assert rig.runtimes["a"].starts == 2


async def test_an_expired_zone_unblocks_like_a_release(rig: Rig) -> None:
    a, _, _ = await three_ready(rig)
    grant = await rig.zone(18000, ttl_s=60)
    expires_at = grant.zone.expires_at
    assert expires_at is not None

    assert rig.arbiter.book.expire_zones(expires_at - 1) == []
    assert (await unavailable(a)).kind == "blocked"

    assert rig.arbiter.book.expire_zones(expires_at) == [grant.zone]
    assert rig.arbiter.book.zones == {}
    assert rig.store.load()["zones"] == []
    lease = await within(a.requests.acquire())
    lease.release()
    assert state_of(a) is BackendState.READY
    assert rig.runtimes["a"].starts == 2


async def test_a_zone_that_cannot_be_granted_leaves_everything_running(rig: Rig) -> None:
    await rig.ready("orchestrator", vram_mib=16000, pinned=True, priority=0)
    small = await rig.ready("small", vram_mib=4000, priority=10)

    with pytest.raises(Conflict) as info:
        await rig.zone(10000)

    assert "cannot grant VRAM zone 'comfy'" in info.value.message
    assert "backend orchestrator 16000 MiB (pinned)" in info.value.message
    assert rig.arbiter.book.zones == {}
    assert state_of(small) is BackendState.READY
    assert small.blocks == {}
    assert rig.runtimes["small"].stops == 0
    assert rig.store.load().get("zones", []) == []
    lease = await within(small.requests.acquire())
    lease.release()


async def test_a_request_during_a_zone_stop_does_not_wake_the_backend(rig: Rig) -> None:
    a = await rig.ready("a", vram_mib=16000, priority=10)
    rig.runtimes["a"].stop_gate.clear()

    granting = asyncio.create_task(rig.zone(16000))
    await within(rig.runtimes["a"].stop_called.wait())
    assert state_of(a) is BackendState.STOPPING

    request = asyncio.create_task(a.requests.acquire())
    await settle()
    if not request.done():
        request.cancel()
        pytest.fail("the request waits for the stop (and would then start the backend)")
    blocked = request.exception()
    assert isinstance(blocked, BackendUnavailable)
    assert blocked.kind == "blocked"
    assert "VRAM zone 'comfy'" in blocked.message
    with pytest.raises(BackendUnavailable) as info:
        await within(a.start())
    assert info.value.kind == "blocked"

    rig.runtimes["a"].stop_gate.set()
    grant = await within(granting)
    assert grant.zone.stopped == ("a",)
    await settle()
    assert state_of(a) is BackendState.STOPPED
    assert rig.runtimes["a"].starts == 1


async def test_a_cancelled_zone_request_leaves_nothing_blocked(rig: Rig) -> None:
    # APP BUG (app/vram/arbiter.py, VramArbiter._make_room): the victims are blocked
    # before their stop, and only a `_NoRoom` unblocks them again. When acquire_zone() is
    # cancelled during the drain (or the probe raises), the zone is never recorded but the
    # victims keep `blocks["zone:comfy"]`: every request gets "blocked" by a zone that
    # does not exist, and release_zone("comfy") answers 404, so nothing can clear it.
    a = await rig.ready("a", vram_mib=16000, priority=10)
    lease = await within(a.requests.acquire())  # busy: the zone's eviction drains it
    granting = asyncio.create_task(rig.zone(16000))
    await until(lambda: a.state is BackendState.STOPPING)

    granting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await granting
    lease.release()
    await until(lambda: a.state is BackendState.STOPPED)

    held = {f"zone:{name}" for name in rig.arbiter.book.zones}
    assert set(a.blocks) <= held, f"blocked by zones nobody holds: {a.blocks}"


async def test_a_zone_on_a_gpu_that_is_not_there_is_invalid(rig: Rig) -> None:
    await rig.ready("a", vram_mib=8000)
    with pytest.raises(InvalidRequest) as info:
        await rig.arbiter.acquire_zone(
            "comfy", holder="comfyui", mib=1000, gpu=3, ttl_s=None, below_priority=None
        )
    assert info.value.message == "GPU 3 is not present (the probe sees [0])"
    assert rig.arbiter.book.zones == {}


async def test_a_backend_on_a_gpu_that_is_not_there_is_refused(rig: Rig) -> None:
    elsewhere = rig.add("elsewhere", vram_mib=8000, gpus=[1])
    refused = await unavailable(elsewhere)
    assert refused.kind == "no_vram"
    assert "GPU 1 is not present (the probe sees [0])" in refused.message
    assert rig.runtimes["elsewhere"].starts == 0


async def test_zones_survive_a_restart(rigs: Rigs) -> None:
    before = rigs.make()
    await three_ready(before)
    grant = await before.zone(18000)

    after = rigs.make()  # a new gateway over the same state directory
    for name, mib in (("a", 8000), ("b", 8000), ("c", 4000)):
        after.add(name, vram_mib=mib, priority=50)

    assert after.arbiter.book.restore() == [grant.zone]

    assert after.arbiter.book.zones == {"comfy": grant.zone}
    assert after.placed() == {0: 18000}
    for name in ("a", "b"):
        assert (await unavailable(after.backends[name])).kind == "blocked"
        assert after.runtimes[name].starts == 0
    lease = await within(after.backends["c"].requests.acquire())
    lease.release()


async def test_expired_saved_zones_are_dropped_at_restore(rig: Rig) -> None:
    now = time.time()
    old = Zone("old", "comfyui", 0, 8000, now - 7200, now - 3600, ("a",))
    live = Zone("live", "comfyui", 0, 8000, now - 60, now + 3600, ("b",))
    rig.store.save({"zones": [old.to_json(), live.to_json()]})
    a = rig.add("a", vram_mib=8000)
    b = rig.add("b", vram_mib=8000)

    assert rig.arbiter.book.restore() == [live]

    assert a.blocks == {}
    assert list(b.blocks) == ["zone:live"]
    assert rig.store.load()["zones"] == [live.to_json()]
    lease = await within(a.requests.acquire())
    lease.release()
