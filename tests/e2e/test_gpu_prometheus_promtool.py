"""The GPU families fed by `gpu.probe: prometheus` (the stand-in Prometheus serving
dcgm-exporter series) pass `promtool check metrics` as the NVML ones do (apart from the
dcgm-exporter label names: tests/fakes/promtool.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import Settings
from tests.e2e.conftest import require_tool
from tests.fakes.prometheus import dcgm_gpu, fake_prometheus
from tests.fakes.promtool import check_metrics
from tests.fakes.servers import gateway, gateway_settings
from tests.fakes.waits import until

pytestmark = pytest.mark.e2e

LABELLED = {
    f"microscheduler_gpu_{name}"
    for name in (
        "memory_used_bytes",
        "memory_free_bytes",
        "memory_total_bytes",
        "memory_reserved_bytes",
        "utilization_ratio",
        "memory_utilization_ratio",
        "temperature_celsius",
        "power_watts",
        "lost",
    )
}


async def test_the_prometheus_probes_gpu_families_pass_promtool(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    async with fake_prometheus(*dcgm_gpu(0), *dcgm_gpu(1)) as prometheus:
        settings: Settings = gateway_settings(
            {"b": {"url": "http://127.0.0.1:9", "models": ["m"]}},
            state_dir=tmp_path / "var",
            gpu={
                "probe": "prometheus",
                "poll_interval_s": 0.05,
                "prometheus": {"url": prometheus.url, "selector": '{Hostname="node-c"}'},
            },
        )
        async with gateway(settings) as gw:

            async def scraped() -> str | None:
                text = (await gw.client.get("/metrics")).text
                return text if 'microscheduler_gpu_probe_up{host="local"} 1.0' in text else None

            text = await until(scraped, what="a first good sample from the stand-in Prometheus")
    assert 'microscheduler_gpu_power_watts{UUID="GPU-node-c-0001"' in text
    assert check_metrics(promtool, text) == LABELLED
