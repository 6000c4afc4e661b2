"""A scrape with every metric family present passes `promtool check metrics` (apart from
the dcgm-exporter label names: tests/fakes/promtool.py).

The gateway runs in process with a GPU source that reports every NVML field (so each GPU
family has samples), a real fake vLLM (so its /metrics is scraped), a request served, a
yield taken and restored and a GPU profile active.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.gpu.telemetry import GpuProcess, GpuSnapshot, GpuSource, GpuStats
from app.services import Seams
from app.settings.profiles import GpuProfilesConfig
from tests.e2e.conftest import require_tool
from tests.fakes.promtool import check_metrics
from tests.fakes.servers import fake_vllm, gateway, gateway_settings
from tests.fakes.waits import until

pytestmark = pytest.mark.e2e
GIB = 1024**3
FAMILIES = (
    "microscheduler_requests",
    "microscheduler_request_duration_seconds",
    "microscheduler_time_to_first_byte_seconds",
    "microscheduler_upstream_errors",
    "microscheduler_requests_in_flight",
    "microscheduler_backend_up",
    "microscheduler_backend_state",
    "microscheduler_backend_gpu",
    "microscheduler_backend_starts",
    "microscheduler_backend_start_duration_seconds",
    "microscheduler_backend_stops",
    "microscheduler_requests_waiting",
    "microscheduler_drain_timeouts",
    "microscheduler_backend_sleeps",
    "microscheduler_sleep_guard",
    "microscheduler_swaps",
    "microscheduler_swap_wait_seconds",
    "microscheduler_gpu_probe_up",
    "microscheduler_gpu_snapshot_age_seconds",
    "microscheduler_gpu_memory_used_bytes",
    "microscheduler_gpu_memory_free_bytes",
    "microscheduler_gpu_memory_total_bytes",
    "microscheduler_gpu_memory_reserved_bytes",
    "microscheduler_gpu_utilization_ratio",
    "microscheduler_gpu_memory_utilization_ratio",
    "microscheduler_gpu_temperature_celsius",
    "microscheduler_gpu_power_watts",
    "microscheduler_gpu_lost",
    "microscheduler_host_ram_probe_up",
    "microscheduler_host_ram_total_bytes",
    "microscheduler_host_ram_available_bytes",
    "microscheduler_host_ram_sleep_budget_bytes",
    "microscheduler_host_ram_reserve_bytes",
    "microscheduler_host_ram_sleep_charged_bytes",
    "microscheduler_host_ram_sleepers",
    "microscheduler_backend_kv_cache_usage_ratio",
    "microscheduler_backend_requests_running",
    "microscheduler_backend_requests_waiting",
    "microscheduler_backend_metrics_up",
    "microscheduler_vram_yield_active",
    "microscheduler_vram_yields",
    "microscheduler_vram_yield_freed_bytes",
    "microscheduler_state_save_failures",
    "microscheduler_state_persisted",
    "microscheduler_profile_active",
    "microscheduler_backend_enabled",
    "microscheduler_key_requests",
    "microscheduler_key_tokens",
    "microscheduler_key_limited",
    "microscheduler_event_loop_lag_seconds",
    "microscheduler_event_loop_lag_max_seconds",
)


class FullGpu:
    """A GPU that reports every field NVML can give."""

    name = "fake-nvml"

    async def sample(self) -> GpuSnapshot:
        stats = GpuStats(
            index=0,
            uuid="GPU-5f1c2a7e-0000-4000-8000-000000000000",
            name="NVIDIA GeForce RTX 5090",
            total_bytes=32 * GIB,
            used_bytes=20 * GIB,
            free_bytes=12 * GIB,
            reserved_bytes=GIB // 2,
            utilization_gpu_pct=37.0,
            utilization_memory_pct=12.0,
            temperature_c=61.0,
            power_w=212.5,
            processes=(GpuProcess(4242, 19 * GIB),),
        )
        now = time.monotonic()
        return GpuSnapshot("nvml", (stats,), now, time.time(), driver_version="575.51.03")

    async def close(self) -> None:
        return None


def full_gpu(placed: Callable[[], dict[int, int]]) -> GpuSource:
    return FullGpu()


async def test_a_scrape_with_every_family_passes_promtool() -> None:
    promtool = require_tool("promtool")
    async with fake_vllm(models=["m"]) as upstream:
        settings = gateway_settings(
            {"local": {"url": upstream.url, "models": ["m"]}},
            gpu={"poll_interval_s": 0.05},
            gpu_profiles=GpuProfilesConfig.model_validate({"profiles": {"all": {}}}),
        )
        async with gateway(settings, seams=Seams(gpu_source_factory=full_gpu)) as gw:
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            assert (await gw.client.post("/v1/chat/completions", json=chat)).status_code == 200
            assert (await gw.client.post("/vram/yield", json={})).status_code == 200
            assert (await gw.client.post("/vram/restore")).status_code == 200

            async def scraped() -> str | None:
                text = (await gw.client.get("/metrics")).text
                return (
                    text
                    if 'microscheduler_backend_metrics_up{backend="local"} 1.0' in text
                    else None
                )

            text = await until(scraped, what="the vLLM scrape and the GPU poll to have run")
    families = {f.name for f in text_string_to_metric_families(text)}
    missing = [name for name in FAMILIES if name not in families]
    assert missing == []
    assert 'microscheduler_gpu_power_watts{UUID="GPU-5f1c2a7e' in text
    assert 'microscheduler_backend_kv_cache_usage_ratio{backend="local"}' in text
    flagged = check_metrics(promtool, text)
    # Exactly the families with dcgm-exporter's labels (tests/fakes/promtool.py).
    assert flagged == {f for f in FAMILIES if f.startswith("microscheduler_gpu_")} - {
        "microscheduler_gpu_probe_up",
        "microscheduler_gpu_snapshot_age_seconds",
    }
