"""A sleeping backend in admission: what it counts, eviction by sleep, the wake admitted
for what it takes back. The arbiter's GPU is simulated from what each fake server holds
(its footprint awake, its residue asleep, nothing stopped), as a ledger or NVML shows it.
No processes, no sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from app.errors import BackendUnavailable, UnavailableKind
from app.gpu.poller import GpuMonitor
from app.gpu.sim import SimSource
from app.lifecycle.admission import (
    asleep_mib,
    asleep_reason,
    may_have_slept,
    wake_mib,
)
from app.lifecycle.backend import Backend
from app.lifecycle.metrics import LifecycleMetrics as Metrics
from app.lifecycle.state import BackendState, StopReason
from app.lifecycle.store import StateStore
from app.settings import BackendConfig, TimeoutsConfig
from app.upstreams.http import HttpUpstream
from app.upstreams.vllm import VllmClient
from app.vram.arbiter import VramArbiter
from tests.fakes.runtimes import FakeRuntime

TOTAL_MIB = 24000
T = TypeVar("T")


# -- the pure rules -------------------------------------------------------------------------


def test_asleep_counts_what_the_probe_did_not_see_freed() -> None:
    assert asleep_mib(16000, 14000, None) == 2000
    assert asleep_mib(16000, 14000, 5000) == 2000  # measured beats declared
    assert asleep_mib(16000, 20000, None) == 0  # more than its footprint: it holds nothing
    assert asleep_mib(16000, 0, 3000) == 3000  # nothing seen freed: the declared estimate
    assert asleep_mib(16000, None, 30000) == 16000  # never more than its footprint
    assert asleep_mib(16000, None, None) is None  # nothing known: its whole footprint
    assert asleep_mib(None, 14000, 3000) is None  # not checked at all
    # Not measured (its GPU was full): what its last measured sleep kept, before declared.
    assert asleep_mib(16000, None, 3000, 2000) == 2000
    assert asleep_mib(16000, 14500, 3000, 2000) == 1500  # a measurement beats it
    assert asleep_mib(8000, None, None, 9000) == 8000  # never more than its footprint


def test_a_wake_takes_back_its_footprint_minus_what_it_kept() -> None:
    assert wake_mib(16000, 2000) == 14000
    assert wake_mib(16000, None) == 0  # counted whole while asleep: nothing more to find
    assert wake_mib(16000, 20000) == 0
    assert wake_mib(None, 2000) is None


# -- a rig ------------------------------------------------------------------------------------


class Server:
    """A backend's fake vLLM control endpoints: health, and sleep mode unless `dev_mode`
    is off (then 404, as vLLM without VLLM_SERVER_DEV_MODE=1)."""

    DEV_MODE_PATHS = (
        "/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache",
    )  # fmt: skip

    def __init__(self, awake_mib: int, asleep_mib: int, *, dev_mode: bool) -> None:
        self.awake_mib = awake_mib
        self.asleep_mib = asleep_mib
        self.dev_mode = dev_mode
        self.asleep_tags: set[str] = set()
        self.metrics = ""  # the body of GET /metrics
        self.wakes = 0  # every tag awake again
        self.calls: list[str] = []  # sleep mode's calls but /is_sleeping: "POST /wake_up?..."

    @property
    def sleeping(self) -> bool:
        return bool(self.asleep_tags)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path in self.DEV_MODE_PATHS and not self.dev_mode:
            return httpx.Response(404)
        if path == "/is_sleeping":
            return httpx.Response(200, json={"is_sleeping": self.sleeping})
        if path == "/metrics":
            return httpx.Response(200, text=self.metrics)
        if path in self.DEV_MODE_PATHS:
            query = request.url.query.decode()
            call = f"{request.method} {path}" + (f"?{query}" if query else "")
            self.calls.append(call + request.content.decode())
        if path == "/sleep":
            self.asleep_tags = {"weights", "kv_cache"}
        elif path == "/wake_up" and self.asleep_tags:
            self.asleep_tags -= set(request.url.params.get_list("tags")) or self.asleep_tags
            self.wakes += not self.asleep_tags
        return httpx.Response(200)


class Rig:
    def __init__(self, state_dir: Path, *, measured: bool = True) -> None:
        self.metrics = Metrics()
        self.backends: dict[str, Backend] = {}
        self.runtimes: dict[str, FakeRuntime] = {}
        self.servers: dict[str, Server] = {}
        self._clients: list[httpx.AsyncClient] = []
        self.foreign_mib = 0  # memory the gateway does not manage (a game)
        used = self.used if measured else self.placed
        gpus = GpuMonitor(SimSource(TOTAL_MIB, 1, used), poll_interval_s=1.0, stale_after_s=10.0)
        self.arbiter = VramArbiter(gpus, StateStore(state_dir), reclaim_timeout_s=2.0)
        self.arbiter.attach(self.backends)

    def used(self) -> dict[int, int]:
        """What the servers (and anything foreign) hold, as the GPU shows it."""
        held = self.foreign_mib
        for name, server in self.servers.items():
            if self.runtimes[name].running:
                held += server.asleep_mib if server.sleeping else server.awake_mib
        return {0: held}

    def placed(self) -> dict[int, int]:
        return self.arbiter.placed_mib()

    def add(
        self,
        name: str,
        *,
        vram_mib: int,
        asleep: int = 0,
        priority: int = 50,
        dev_mode: bool = True,
        **config: Any,
    ) -> Backend:
        cfg = BackendConfig(
            url=f"http://{name}:8000",
            models=[name],
            runtime={"kind": "process", "command": ["serve", name]},
            lifecycle="lazy",
            priority=priority,
            vram_mib=vram_mib,
            **config,
        )
        server = Server(vram_mib, asleep, dev_mode=dev_mode)
        client = httpx.AsyncClient(transport=httpx.MockTransport(server))
        self._clients.append(client)
        runtime = FakeRuntime()
        backend = Backend(
            name,
            cfg,
            runtime,
            HttpUpstream(name, cfg.url, TimeoutsConfig()),
            VllmClient(client, cfg.url),
            self.metrics,
            admission=self.arbiter,
        )
        self.backends[name], self.runtimes[name], self.servers[name] = backend, runtime, server
        return backend

    async def ready(self, name: str, **config: Any) -> Backend:
        backend = self.add(name, **config)
        await within(backend.start())
        assert state_of(backend) is BackendState.READY
        return backend

    def sleeps(self, backend: str, reason: str, outcome: str = "slept") -> float | None:
        return self.metrics.registry.get_sample_value(
            "microscheduler_backend_sleeps_total",
            {"backend": backend, "outcome": outcome, "reason": reason},
        )

    async def close(self) -> None:
        for backend in self.backends.values():
            await backend.abandon()
        for client in self._clients:
            await client.aclose()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    made = Rig(tmp_path / "state")
    yield made
    await made.close()


def state_of(backend: Backend) -> BackendState:
    return backend.state  # a fresh read: no narrowing carried over an await


def level_of(backend: Backend) -> int | None:
    return backend.memory.asleep_level  # a fresh read, as `state_of`


async def within(awaitable: Awaitable[T], seconds: float = 5.0) -> T:
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        pytest.fail(f"still waiting after {seconds:g}s")


SLEEPS_FOR_EVICTION: dict[str, Any] = {"eviction": {"method": "sleep", "level": 1}}


# -- eviction by sleep ------------------------------------------------------------------------


async def test_eviction_puts_a_backend_to_sleep_and_counts_only_its_residue(rig: Rig) -> None:
    low = await rig.ready("low", vram_mib=16000, asleep=2000, priority=10, **SLEEPS_FOR_EVICTION)
    high = await rig.ready("high", vram_mib=10000, priority=50)
    assert state_of(high) is BackendState.READY
    assert state_of(low) is BackendState.SLEEPING
    assert rig.runtimes["low"].stops == 0  # asleep, not stopped
    assert low.memory.asleep_mib == 2000  # measured: 14000 freed of its 16000
    assert low.memory.holds_vram
    assert rig.arbiter.placed_mib() == {0: 12000}
    assert rig.sleeps("low", "eviction") == 1.0
    assert low.reason is not None
    assert "holds 2000 MiB" in low.reason

    # A later start needing more than the sleep freed stops the sleeper fully.
    third = await rig.ready("third", vram_mib=13000, priority=50)
    assert state_of(third) is BackendState.READY
    assert state_of(low) is BackendState.STOPPED
    assert rig.runtimes["low"].stops == 1
    assert low.memory.asleep_mib is None
    assert rig.arbiter.placed_mib() == {0: 23000}


async def test_a_sleep_that_frees_too_little_is_followed_by_a_stop(rig: Rig) -> None:
    low = await rig.ready("low", vram_mib=16000, asleep=6000, priority=10, **SLEEPS_FOR_EVICTION)
    high = await rig.ready("high", vram_mib=20000, priority=50)
    assert state_of(high) is BackendState.READY
    assert state_of(low) is BackendState.STOPPED  # asleep it kept 6000: 2000 too many
    assert rig.sleeps("low", "eviction") == 1.0
    assert rig.runtimes["low"].stops == 1
    assert rig.arbiter.placed_mib() == {0: 20000}


async def test_without_sleep_mode_eviction_stops_and_says_so(rig: Rig) -> None:
    low = await rig.ready("low", vram_mib=16000, priority=10, dev_mode=False, **SLEEPS_FOR_EVICTION)
    await rig.ready("high", vram_mib=10000, priority=50)
    assert state_of(low) is BackendState.STOPPED
    assert rig.sleeps("low", "eviction", "stopped") == 1.0
    stops = rig.metrics.registry.get_sample_value(
        "microscheduler_backend_stops_total", {"backend": "low", "reason": "eviction"}
    )
    assert stops == 1.0


async def test_a_zone_stops_even_a_backend_that_sleeps_for_eviction(rig: Rig) -> None:
    low = await rig.ready("low", vram_mib=16000, asleep=2000, priority=10, **SLEEPS_FOR_EVICTION)
    await within(
        rig.arbiter.acquire_zone(
            "comfy", holder="comfyui", mib=20000, gpu=0, ttl_s=60, below_priority=None
        )
    )
    assert state_of(low) is BackendState.STOPPED
    assert rig.sleeps("low", "eviction") == 0.0


# -- the wake is admitted -------------------------------------------------------------------


async def test_a_wake_that_does_not_fit_is_refused_and_stays_asleep(rig: Rig) -> None:
    low = await rig.ready("low", vram_mib=16000, asleep=2000, priority=10, **SLEEPS_FOR_EVICTION)
    await rig.ready("high", vram_mib=10000, priority=50)
    assert state_of(low) is BackendState.SLEEPING
    # Waking takes back 14000 MiB; 12000 are free and `high` is not below its priority.
    with pytest.raises(BackendUnavailable) as info:
        await within(low.requests.acquire())
    assert info.value.kind is UnavailableKind.NO_VRAM
    assert "not enough VRAM to wake" in info.value.message
    assert state_of(low) is BackendState.SLEEPING
    assert rig.servers["low"].wakes == 0
    assert low.memory.asleep_mib == 2000  # still counted as what it kept
    assert rig.arbiter.placed_mib() == {0: 12000}


async def test_a_wake_evicts_like_a_start(rig: Rig) -> None:
    sleeper = await rig.ready("sleeper", vram_mib=16000, asleep=2000, priority=40)
    await within(sleeper.sleep(StopReason.ADMIN, level=1))
    assert sleeper.memory.asleep_mib == 2000
    low = await rig.ready("low", vram_mib=10000, priority=30)  # fits beside the residue
    lease = await within(sleeper.requests.acquire())  # takes back 14000 of 12000 free: `low` goes
    lease.release()
    assert state_of(sleeper) is BackendState.READY
    assert rig.servers["sleeper"].wakes == 1
    assert rig.runtimes["sleeper"].starts == 1  # woken, not started again
    assert state_of(low) is BackendState.STOPPED
    assert sleeper.memory.asleep_mib is None
    assert sleeper.memory.measured_mib == 16000  # the start's measure, not the wake's 14000
    assert rig.arbiter.placed_mib() == {0: 16000}


async def test_two_sleepers_waking_at_once_do_not_wait_for_each_other(rig: Rig) -> None:
    # Each wake needs the other's residue, and each sleeper is `starting` while its wake
    # waits for room: were a wake not yet admitted waited for like a start under way, the
    # two would wait for each other up to their start_timeout_s (300 s). One wakes (the
    # other's residue evicted), the other is refused at once, as before.
    first = await rig.ready("first", vram_mib=12000, asleep=2000)
    await within(first.sleep(StopReason.ADMIN, level=1))
    second = await rig.ready("second", vram_mib=12000, asleep=2000)
    await within(second.sleep(StopReason.ADMIN, level=1))
    await within(  # 12000 of the 20000 free: each wake (10000) now needs the other's 2000
        rig.arbiter.acquire_zone(
            "comfy", holder="comfyui", mib=12000, gpu=0, ttl_s=60, below_priority=None
        )
    )
    wakes = [asyncio.create_task(b.requests.acquire()) for b in (first, second)]
    await within(asyncio.wait(wakes))
    outcomes = [w.exception() or w.result() for w in wakes]
    refused = [o for o in outcomes if isinstance(o, BackendUnavailable)]
    assert len(refused) == 1, outcomes
    assert refused[0].kind is UnavailableKind.NO_VRAM
    for wake in wakes:
        if wake.exception() is None:
            wake.result().release()


# -- idle -----------------------------------------------------------------------------------

SLEEPS_WHEN_IDLE: dict[str, Any] = {"idle_ttl_s": 10, "idle": {"method": "sleep", "level": 2}}


async def test_an_idle_backend_sleeps_and_its_next_request_wakes_it(rig: Rig) -> None:
    backend = await rig.ready("b", vram_mib=16000, asleep=2000, **SLEEPS_WHEN_IDLE)
    assert await within(backend.stop_if_idle(backend.requests.last_used + 5)) is False
    assert await within(backend.stop_if_idle(backend.requests.last_used + 10)) is True
    assert state_of(backend) is BackendState.SLEEPING
    assert backend.reason is not None
    assert backend.reason.startswith("asleep (level 2, idle")
    assert backend.memory.asleep_mib == 2000
    assert rig.sleeps("b", "idle") == 1.0
    assert rig.runtimes["b"].stops == 0
    # Asleep it is not idle-stopped again: a second TTL does nothing.
    assert await within(backend.stop_if_idle(backend.requests.last_used + 3600)) is False
    lease = await within(backend.requests.acquire())
    lease.release()
    assert state_of(backend) is BackendState.READY
    assert rig.servers["b"].wakes == 1
    assert rig.arbiter.placed_mib() == {0: 16000}
    # Level 2 discarded the weights: the wake reloads them (vLLM's sleep-mode docs).
    assert rig.servers["b"].calls[-5:] == LEVEL_2_SLEEP_AND_WAKE
    assert backend.memory.asleep_level is None


LEVEL_2_SLEEP_AND_WAKE = [
    "POST /sleep?level=2",
    "POST /wake_up?tags=weights",
    'POST /collective_rpc{"method":"reload_weights","timeout":60.0}',
    "POST /wake_up?tags=kv_cache",
    "POST /reset_prefix_cache",
]


async def test_the_wake_follows_the_level_slept_at(rig: Rig) -> None:
    backend = await rig.ready("b", vram_mib=16000, asleep=2000)
    await within(backend.sleep(StopReason.ADMIN, level=1))
    assert backend.memory.asleep_level == 1
    await within(backend.start())
    assert rig.servers["b"].calls[-2:] == ["POST /sleep?level=1", "POST /wake_up"]
    await within(backend.sleep(StopReason.ADMIN, level=2))
    assert backend.memory.asleep_level == 2
    await within(backend.start())
    assert rig.servers["b"].calls[-5:] == LEVEL_2_SLEEP_AND_WAKE
    # A stop forgets the level.
    await within(backend.sleep(StopReason.ADMIN, level=1))
    await within(backend.stop(StopReason.ADMIN))
    assert (level_of(backend), state_of(backend)) == (None, BackendState.STOPPED)


async def test_a_server_found_asleep_at_gateway_start_is_woken_with_the_reload(
    rig: Rig,
) -> None:
    """The level it slept at is not known: the full sequence, safe after either level."""
    backend = rig.add("b", vram_mib=16000, asleep=2000, **SLEEPS_WHEN_IDLE)
    rig.runtimes["b"].running = True
    rig.servers["b"].asleep_tags = {"weights", "kv_cache"}
    await within(backend.adopt())
    assert state_of(backend) is BackendState.SLEEPING
    assert backend.memory.asleep_level is None
    lease = await within(backend.requests.acquire())
    lease.release()
    assert state_of(backend) is BackendState.READY
    assert rig.servers["b"].calls == LEVEL_2_SLEEP_AND_WAKE[1:]
    assert rig.runtimes["b"].starts == 0


# A sleeper's /metrics, as vLLM 0.33 exposes vllm:engine_sleep_state
# (vllm/v1/metrics/loggers.py; more in test_vllm_sleep_state.py).
ASLEEP_AT = {
    level: "# TYPE vllm:engine_sleep_state gauge\n"
    + "".join(
        f'vllm:engine_sleep_state{{engine="0",model_name="b",sleep_state="{state}"}} {value}\n'
        for state, value in (
            ("awake", 0.0),
            ("weights_offloaded", 1.0 if level == 1 else 0.0),
            ("discard_all", 1.0 if level == 2 else 0.0),
        )
    )
    for level in (1, 2)
}


@pytest.mark.parametrize("level", [1, 2])
async def test_a_server_found_asleep_is_woken_as_its_metrics_say_it_slept(
    rig: Rig, level: int
) -> None:
    """vLLM's sleep-state gauge tells the level: a level-1 sleeper gets the plain wake (its
    weights are in host RAM, no reload from disk), a level-2 one the reload sequence."""
    backend = rig.add("b", vram_mib=16000, asleep=2000, **SLEEPS_WHEN_IDLE)
    rig.runtimes["b"].running = True
    rig.servers["b"].asleep_tags = {"weights", "kv_cache"}
    rig.servers["b"].metrics = ASLEEP_AT[level]
    await within(backend.adopt())
    assert state_of(backend) is BackendState.SLEEPING
    assert backend.reason == f"found asleep at gateway start (level {level})"
    assert level_of(backend) == level
    lease = await within(backend.requests.acquire())
    lease.release()
    assert state_of(backend) is BackendState.READY
    wake = ["POST /wake_up"] if level == 1 else LEVEL_2_SLEEP_AND_WAKE[1:]
    assert rig.servers["b"].calls == wake
    assert rig.runtimes["b"].starts == 0


async def test_an_idle_backend_without_sleep_mode_is_stopped_instead(rig: Rig) -> None:
    backend = await rig.ready("b", vram_mib=16000, dev_mode=False, **SLEEPS_WHEN_IDLE)
    assert await within(backend.stop_if_idle(backend.requests.last_used + 10)) is True
    assert state_of(backend) is BackendState.STOPPED
    assert rig.sleeps("b", "idle", "stopped") == 1.0
    stops = rig.metrics.registry.get_sample_value(
        "microscheduler_backend_stops_total", {"backend": "b", "reason": "idle"}
    )
    assert stops == 1.0


# -- without a measure --------------------------------------------------------------------


async def test_unmeasured_a_sleeper_counts_its_declared_residue_else_everything(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, measured=False)  # the GPU shows what the gateway placed
    try:
        declared = await rig.ready("declared", vram_mib=8000, asleep_mib=1500)
        silent = await rig.ready("silent", vram_mib=8000)
        await within(declared.sleep(StopReason.ADMIN, level=1))
        await within(silent.sleep(StopReason.ADMIN, level=1))
        assert declared.memory.asleep_mib == 1500
        assert silent.memory.asleep_mib is None  # counted whole: nothing seen or declared freed
        assert rig.arbiter.placed_mib() == {0: 9500}
    finally:
        await rig.close()


async def test_a_sleep_on_a_full_gpu_keeps_what_its_measured_sleep_kept(rig: Rig) -> None:
    """A game asks for more than is free: the GPU shows it full, and the sleep's memory
    goes to it at once. "Used before minus after" would count the game's 10000 MiB as
    what the sleeper holds (it kept 2000, as its sleep on a GPU with room measured)."""
    backend = await rig.ready("b", vram_mib=16000, asleep=2000)
    await within(backend.sleep(StopReason.ADMIN, level=2))
    assert backend.memory.asleep_mib == 2000  # measured: 14000 freed
    await within(backend.start())
    rig.foreign_mib = 10000  # 26000 asked of 24000: the GPU shows 24000 used
    await within(backend.sleep(StopReason.ADMIN, level=2))
    assert backend.memory.asleep_mib == 2000
    assert backend.memory.held_mib == 2000
    assert backend.reason is not None
    assert "holds 2000 MiB" in backend.reason
    assert rig.arbiter.held_mib(measured=True) == {0: 2000}
    rig.foreign_mib = 20000  # the game grows while it sleeps: still the game's
    assert rig.arbiter.held_mib(measured=True) == {0: 2000}


async def test_a_first_sleep_on_a_full_gpu_counts_its_declared_residue_else_everything(
    rig: Rig,
) -> None:
    declared = await rig.ready("declared", vram_mib=8000, asleep=1000, asleep_mib=1500)
    rig.foreign_mib = 20000  # 28000 asked of 24000; 21000 after the sleep
    await within(declared.sleep(StopReason.ADMIN, level=2))
    assert declared.memory.asleep_mib == 1500  # its `asleep_mib:`, not the game's 4000 MiB
    await within(declared.stop(StopReason.ADMIN))

    rig.foreign_mib = 0
    silent = await rig.ready("silent", vram_mib=8000, asleep=1000)
    rig.foreign_mib = 20000
    await within(silent.sleep(StopReason.ADMIN, level=2))
    assert silent.memory.asleep_mib is None  # counted whole: nothing measured or declared
    assert silent.memory.held_mib == 8000


def test_a_server_found_running_may_be_asleep_when_any_method_sleeps() -> None:
    def config(**fields: Any) -> BackendConfig:
        return BackendConfig(url="http://b:8000", models=["m"], **fields)

    assert not may_have_slept(config(), None)
    assert may_have_slept(config(idle={"method": "sleep"}), None)
    assert may_have_slept(config(eviction={"method": "sleep"}), None)
    assert may_have_slept(config(), "sleep")  # a GPU profile's sleep_mode
    assert may_have_slept(config(**{"yield": {"method": "sleep"}}), "stop")
    assert asleep_reason(1, "idle", 2000) == "asleep (level 1, idle, holds 2000 MiB)"
    assert asleep_reason(2, "eviction", None) == "asleep (level 2, eviction)"
