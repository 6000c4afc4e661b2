"""The sleep guard, end to end on the simulated GPU: a fake vLLM that leaks over sleep/wake
cycles (`--sleep-leak-mib`) or whose wake fails (`--wake-fail-after`) or hangs (a wake
slower than the control timeout) is stopped instead of left asleep or half awake, with a
`sleep_guard` event and `microscheduler_sleep_guard_total{backend,cause}`, and its next
request starts it cold.

One lazy backend (`embed`, 4000 MiB awake, 500 asleep) on a 32768 MiB GPU, put to sleep at
level 1 when idle for 0.2 s; its fake reports its footprint to the GPU's ledger, which is
what the gateway measures a sleep by.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from app.runtimes.base import Runtime
from app.services import Seams
from app.settings import BackendConfig
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeVllmRuntime,
    Gateway,
    chat,
    gateway,
    gateway_settings,
    until_backend,
)

TOTAL, AWAKE, ASLEEP = 32768, 4000, 500
IDLE_SLEEP: dict[str, Any] = {"idle_ttl_s": 0.2, "idle": {"method": "sleep", "level": 1}}


class Rig:
    def __init__(self, tmp_path: Path, **fake: Any) -> None:
        self.ledger = tmp_path / "ledger"
        self.state_dir = tmp_path / "var"
        self.port = free_port()
        self.runtime = FakeVllmRuntime(
            self.port, models=["embed-model"], vram_mib=AWAKE, vram_asleep_mib=ASLEEP,
            sim_gpu_dir=str(self.ledger), dev_mode=True, **fake,
        )  # fmt: skip

    @asynccontextmanager
    async def gateway(self, **backend: Any) -> AsyncIterator[Gateway]:
        def runtime_for(name: str, config: BackendConfig) -> Runtime:
            return self.runtime

        embed = {
            "url": f"http://127.0.0.1:{self.port}", "models": ["embed-model"],
            "runtime": {"kind": "process", "command": ["unused: the test's runtime runs it"]},
            "lifecycle": "lazy", "vram_mib": AWAKE, **IDLE_SLEEP, **backend,
        }  # fmt: skip
        settings = gateway_settings(
            {"embed": embed},
            state_dir=self.state_dir,
            gpu={
                "probe": "sim",
                "poll_interval_s": 0.05,
                "sim": {"total_mib": TOTAL, "ledger_dir": self.ledger},
            },
            reaper_interval_s=0.05,
        )
        async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
            yield gw


async def use(gw: Gateway) -> int:
    response = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
    return response.status_code


async def cycle(gw: Gateway) -> dict[str, Any]:
    """A request (a start or a wake), then the idle sleep: the view once it sleeps."""
    assert await use(gw) == 200
    return await until_backend(gw, "embed", state="sleeping")


def guard_trips(metrics: str, cause: str) -> float | None:
    labels = {"backend": "embed", "cause": cause}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "microscheduler_sleep_guard_total" and sample.labels == labels:
                return float(sample.value)
    return None


async def guard_events(gw: Gateway) -> list[dict[str, Any]]:
    events = (await gw.client.get("/status")).json()["events"]
    return [e for e in events if e["kind"] == "sleep_guard"]


async def test_a_leak_over_sleep_wake_cycles_stops_it_and_its_next_request_starts_it_cold(
    tmp_path: Path,
) -> None:
    # Each cycle leaves 300 MiB more held asleep; the guard allows 512 over the first
    # (`sleep_leak_mib`'s default).
    rig = Rig(tmp_path, sleep_leak_mib=300)
    async with rig.gateway() as gw:
        first = await cycle(gw)
        assert first["asleep_mib"] == ASLEEP
        second = await cycle(gw)  # 300 MiB more: within the threshold, it sleeps
        assert second["asleep_mib"] == ASLEEP + 300

        assert await use(gw) == 200  # the third sleep holds 600 more: stopped instead
        view = await until_backend(gw, "embed", state="stopped")
        assert "sleep guard" in view["reason"], view["reason"]
        sleeps = view["sleeps"]
        assert (sleeps["cycles"], sleeps["baseline_freed_mib"]) == (3, AWAKE - ASLEEP)
        assert (sleeps["growth_mib"], sleeps["sleep_leak_mib"]) == (600, 512)
        assert [c["held_mib"] for c in sleeps["recent"]] == [ASLEEP, ASLEEP + 300, ASLEEP + 600]
        freed = [c["freed_mib"] for c in sleeps["recent"]]
        assert freed == [AWAKE - ASLEEP, AWAKE - ASLEEP - 300, AWAKE - ASLEEP - 600]
        status = (await gw.client.get("/status")).json()
        [in_status] = [b for b in status["backends"] if b["name"] == "embed"]
        assert in_status["sleeps"] == sleeps
        assert "grew 600 MiB" in view["reason"], view["reason"]
        assert view["holds_vram"] is False
        assert view["sleeps"]["last_trip"]["cause"] == "leak"
        assert rig.runtime.stops == 1
        metrics = (await gw.client.get("/metrics")).text
        assert guard_trips(metrics, "leak") == 1.0
        assert guard_trips(metrics, "wake_failed") == 0.0
        [event] = await guard_events(gw)
        assert (event["backend"], event["cause"]) == ("embed", "leak")
        assert (event["baseline_freed_mib"], event["freed_mib"]) == (3500, 2900)
        assert (event["growth_mib"], event["threshold_mib"]) == (600, 512)
        stops = {"backend": "embed", "reason": "sleep_guard"}
        assert any(
            s.name == "microscheduler_backend_stops_total" and s.labels == stops and s.value == 1
            for f in text_string_to_metric_families(metrics)
            for s in f.samples
        )

        # Its next request starts it cold: a new server, whose sleeps begin again.
        assert await use(gw) == 200
        assert rig.runtime.starts == 2
        view = await until_backend(gw, "embed", state="sleeping")
        assert view["asleep_mib"] == ASLEEP  # the new server's first sleep: no leak yet
        assert view["sleeps"]["cycles"] == 1
        assert view["sleeps"]["last_trip"]["cause"] == "leak"  # still says why it was stopped


async def test_with_sleep_leak_mib_0_a_leak_is_left_asleep(tmp_path: Path) -> None:
    rig = Rig(tmp_path, sleep_leak_mib=1000)
    async with rig.gateway(sleep_leak_mib=0) as gw:
        await cycle(gw)
        view = await cycle(gw)
        assert view["asleep_mib"] == ASLEEP + 1000
        assert view["sleeps"]["growth_mib"] == 1000
        assert rig.runtime.stops == 0


async def test_a_failing_wake_stops_it_and_its_next_request_starts_it_cold(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, wake_fail_after=1)  # the first wake works, the second answers 500
    async with rig.gateway() as gw:
        await cycle(gw)
        await cycle(gw)
        failed = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
        assert failed.status_code == 503, failed.text
        assert "wake from sleep failed" in failed.json()["error"]["message"]
        view = await until_backend(gw, "embed", state="stopped")
        assert "sleep guard" in view["reason"], view["reason"]
        assert "POST /wake_up answered 500" in view["reason"], view["reason"]
        assert view["holds_vram"] is False
        assert rig.runtime.stops == 1
        metrics = (await gw.client.get("/metrics")).text
        assert guard_trips(metrics, "wake_failed") == 1.0
        [event] = await guard_events(gw)
        assert (event["backend"], event["cause"]) == ("embed", "wake_failed")

        # At once (no restart backoff): its next request starts a new server.
        assert await use(gw) == 200
        assert rig.runtime.starts == 2
        assert (await until_backend(gw, "embed", state="ready"))["sleeps"]["cycles"] == 0


async def test_a_wake_that_times_out_stops_it_and_says_so(tmp_path: Path) -> None:
    # The wake copies 3500 MiB at 0.001 GiB/s (an hour); the control timeout is 2 s (the
    # sleep before it answers at once, even on a loaded machine).
    rig = Rig(tmp_path, wake_gib_per_s=0.001)
    async with rig.gateway(timeouts={"control_s": 2.0}) as gw:
        await cycle(gw)
        assert await use(gw) == 503
        view = await until_backend(gw, "embed", state="stopped")
        assert "POST /wake_up: no answer within 2s" in view["reason"], view["reason"]
        metrics = (await gw.client.get("/metrics")).text
        assert guard_trips(metrics, "wake_timeout") == 1.0
        assert guard_trips(metrics, "wake_failed") == 0.0
        assert await use(gw) == 200
        assert rig.runtime.starts == 2
