"""No test reads the RAM of the machine running it: an in-process gateway's host RAM is
the injected reading (`tests.fakes.servers.seams_for_tests`: 64 GiB, 40 GiB available, unless
the test injects its own), and the level-1 decision follows that reading, never
/proc/meminfo. The backend's 30000 MiB of weights would not fit a level-1 sleep on a
machine with less than ~34 GiB free (this one: 24 GiB in all)."""

from __future__ import annotations

from pathlib import Path

from app.gpu.host_ram import FixedRamSource
from app.runtimes.base import Runtime
from app.services import Seams
from app.settings import BackendConfig
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    TEST_RAM_AVAILABLE_MIB,
    TEST_RAM_TOTAL_MIB,
    FakeVllmRuntime,
    chat,
    gateway,
    gateway_settings,
    until_backend,
)

WEIGHTS_MIB = 30000


async def asleep_level(tmp_path: Path, ram: FixedRamSource | None) -> tuple[int, dict[str, object]]:
    """The level a lazy 30000 MiB backend with sleep mode falls asleep at when idle
    (`idle: auto`: level 1 when the host RAM has room, else level 2), and /status host_ram."""
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["big-model"], vram_mib=WEIGHTS_MIB, dev_mode=True)

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtime

    backend = {
        "url": f"http://127.0.0.1:{port}", "models": ["big-model"], "lifecycle": "lazy",
        "vram_mib": WEIGHTS_MIB, "idle_ttl_s": 0.2, "sleep_mode": True,
        "runtime": {"kind": "process", "command": ["unused: the test's runtime runs it"]},
    }  # fmt: skip
    settings = gateway_settings(
        {"big": backend},
        state_dir=tmp_path,
        gpu={"probe": "sim", "poll_interval_s": 0.05, "sim": {"total_mib": 81920}},
        reaper_interval_s=0.05,
        host_ram={"poll_interval_s": 0.05},
    )
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for, ram_source=ram)) as gw:
        response = await gw.client.post(
            "/v1/chat/completions", json=chat("big-model", max_tokens=2)
        )
        assert response.status_code == 200, response.text
        view = await until_backend(gw, "big", state="sleeping")
        host_ram = (await gw.client.get("/status")).json()["host_ram"]
        level: int = view["asleep_level"]
        return level, host_ram


async def test_a_test_gateway_reads_the_injected_host_ram_not_the_machines(tmp_path: Path) -> None:
    level, host_ram = await asleep_level(tmp_path, None)  # the test seams' default reading
    assert host_ram["probe"] == "sim"
    assert (host_ram["total_mib"], host_ram["available_mib"]) == (
        TEST_RAM_TOTAL_MIB,
        TEST_RAM_AVAILABLE_MIB,
    )
    assert level == 1  # 30000 of a 32768 MiB budget, 40960 - 30000 >= the 4096 reserve


async def test_the_level_follows_the_injected_reading(tmp_path: Path) -> None:
    level, host_ram = await asleep_level(tmp_path, FixedRamSource(65536, 2000))
    assert host_ram["available_mib"] == 2000
    assert level == 2  # 2000 MiB available: no room for 30000 MiB pinned in host RAM
