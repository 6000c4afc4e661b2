"""`gpu.probe: auto`, the default, through the gateway in process, on a machine without
NVML (the test seams' `NoNvml`, as on this machine): no GPU probe, VRAM admission off, and
said loudly: a WARNING at start, `gpu.probe: none` and `gpu.warning` in /status (on the
page: a banner). Never a simulated GPU: a model larger than the old default's 32 GiB
simulated GPU starts, as nothing is admitted against a GPU nobody has. `probe: sim`
still simulates (said explicitly, like the demo)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from app.runtimes.base import Runtime
from app.services import Seams
from app.settings import BackendConfig
from tests.fakes.nvml import NoNvml
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, gateway, gateway_settings
from tests.fakes.waits import until

BIG_MIB = 40000  # more than the 32 GiB the simulated GPU had by default


def big_backend(port: int) -> dict[str, Any]:
    return {
        "url": f"http://127.0.0.1:{port}", "models": ["big-model"], "lifecycle": "lazy",
        "vram_mib": BIG_MIB,
        "runtime": {"kind": "process", "command": ["unused: the test's runtime runs it"]},
    }  # fmt: skip


async def test_no_gpu_block_without_nvml_runs_without_admission_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["big-model"], vram_mib=BIG_MIB)

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtime

    nvml = NoNvml()
    settings = gateway_settings({"big": big_backend(port)})  # no gpu: block
    caplog.set_level(logging.WARNING, logger="app.services")
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for, nvml=nvml)) as gw:
        assert nvml.inits == 1  # auto asked NVML (the fake), once
        (warned,) = [r for r in caplog.records if "gpu.probe is auto" in r.getMessage()]
        assert warned.levelno == logging.WARNING
        assert "NVML did not load: NVML Shared Library Not Found" in warned.getMessage()
        status = (await gw.client.get("/status")).json()
        gpu = status["gpu"]
        assert gpu["probe"] == "none"
        assert gpu["up"] is False
        assert gpu["gpus"] == []  # no simulated GPU
        assert "VRAM admission is off" in gpu["warning"]
        assert "gpu: {probe: nvml}" in gpu["warning"]
        assert "probe: sim" in gpu["warning"]
        assert gpu["error"] == gpu["warning"]
        assert status["hosts"][0]["probe"] == "none"
        started = await gw.client.post("/backends/big/start")
        assert started.status_code == 200, started.text  # no admission: 40000 MiB starts
        assert runtime.starts == 1


async def test_probe_sim_said_explicitly_still_simulates_and_admits() -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["big-model"], vram_mib=BIG_MIB)

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtime

    settings = gateway_settings({"big": big_backend(port)}, gpu={"probe": "sim"})
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
        gpu = (await gw.client.get("/status")).json()["gpu"]
        assert (gpu["probe"], gpu["warning"], gpu["source"]) == ("sim", None, "sim")
        assert gpu["gpus"][0]["total_mib"] == 32768
        refused = await gw.client.post("/backends/big/start")
        assert refused.status_code == 503, refused.text  # 40000 MiB on a 32 GiB GPU
        assert runtime.starts == 0


async def test_explicit_nvml_without_nvml_insists_the_probe_is_down() -> None:
    """`probe: nvml` is not `auto`: no warning, no fallback; the probe is reported down
    saying why (as before: `app.gpu.nvml`)."""
    port = free_port()
    settings = gateway_settings({"big": big_backend(port)}, gpu={"probe": "nvml"})
    async with gateway(settings, seams=Seams(nvml=NoNvml())) as gw:

        async def sampled() -> dict[str, Any] | None:
            gpu: dict[str, Any] = (await gw.client.get("/status")).json()["gpu"]
            return gpu if gpu["error"] else None

        gpu = await until(sampled, what="the first NVML sample")
        assert (gpu["probe"], gpu["warning"], gpu["source"]) == ("nvml", None, "nvml")
        assert gpu["up"] is False
        assert "libnvidia-ml.so.1 not found" in (gpu["error"] or "")
