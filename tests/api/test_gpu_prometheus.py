"""`gpu.probe: prometheus` through the gateway in process, against the stand-in Prometheus
(tests/fakes/prometheus.py): `/status` shows the remote host's GPUs and their age, the GPU
families are exported as with NVML, and a Prometheus that goes away shows like a lost
NVML (probe up 0, `/status` says why) until it is back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.settings import Settings
from tests.fakes.prometheus import FakePrometheus, dcgm_gpu, fake_prometheus
from tests.fakes.servers import Gateway, gateway, gateway_settings
from tests.fakes.waits import until


def settings_for(prometheus: FakePrometheus, tmp_path: Path, **prom: Any) -> Settings:
    return gateway_settings(
        {"b": {"url": "http://127.0.0.1:9", "models": ["m"]}},
        state_dir=tmp_path / "var",
        gpu={
            "probe": "prometheus",
            "poll_interval_s": 0.05,
            "stale_after_s": 30,
            "prometheus": {
                "url": prometheus.url,
                "selector": '{Hostname="node-c"}',
                "query_interval_s": 0,
                **prom,
            },
        },
    )


async def gpu_status(gw: Gateway, *, up: bool) -> dict[str, Any] | None:
    body: dict[str, Any] = (await gw.client.get("/status")).json()["gpu"]
    return body if body["up"] is up else None


def gpu_samples(text: str) -> dict[tuple[str, tuple[str, ...]], float]:
    """The GPU samples of a scrape: (name, (host, gpu, UUID, modelName)) -> value."""
    return {
        (
            sample.name,
            tuple(
                sample.labels[k] for k in ("host", "gpu", "UUID", "modelName") if k in sample.labels
            ),
        ): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("microscheduler_gpu_")
        for sample in family.samples
    }


async def metric_line(gw: Gateway, line: str) -> bool:
    return line in (await gw.client.get("/metrics")).text.splitlines()


async def test_status_and_metrics_show_the_remote_gpus_and_their_age(tmp_path: Path) -> None:
    async with fake_prometheus(
        *dcgm_gpu(0, used_mib=1000, free_mib=79000, reserved_mib=500),
        *dcgm_gpu(1, used_mib=30000, free_mib=50000, reserved_mib=None, power_w=None),
        *dcgm_gpu(0, host="node-d"),
    ) as prometheus:
        prometheus.sample_age_s = 20.0
        async with gateway(settings_for(prometheus, tmp_path)) as gw:
            status = await until(lambda: gpu_status(gw, up=True))
            text = (await gw.client.get("/metrics")).text
    assert status["source"] == "prometheus"
    assert status["driver_version"] == "550.54.15"
    assert status["age_s"] == pytest.approx(20, abs=3)  # the samples' age, not the query's
    assert status["stale"] is False  # under stale_after_s (30)
    zero, one = status["gpus"]
    assert (zero["index"], zero["uuid"], zero["name"]) == (
        0,
        "GPU-node-c-0000",
        "NVIDIA A100-SXM4-80GB",
    )
    assert (zero["total_mib"], zero["used_mib"], zero["free_mib"]) == (80500, 1500, 79000)
    assert zero["reserved_mib"] == 500
    assert (zero["utilization_gpu_pct"], zero["temperature_c"], zero["power_w"]) == (35, 41, 87.5)
    assert (one["total_mib"], one["reserved_mib"], one["power_w"]) == (80000, None, None)
    samples = gpu_samples(text)
    mib = 1024 * 1024
    zero_labels = ("local", "0", "GPU-node-c-0000", "NVIDIA A100-SXM4-80GB")
    assert samples[("microscheduler_gpu_probe_up", ("local",))] == 1.0
    assert samples[("microscheduler_gpu_snapshot_age_seconds", ("local",))] == pytest.approx(
        20, abs=3
    )
    for name, value in (
        ("memory_used_bytes", 1500 * mib),
        ("memory_free_bytes", 79000 * mib),
        ("memory_total_bytes", 80500 * mib),
        ("memory_reserved_bytes", 500 * mib),
        ("utilization_ratio", 0.35),
        ("memory_utilization_ratio", 0.1),
        ("temperature_celsius", 41.0),
        ("power_watts", 87.5),
        ("lost", 0.0),
    ):
        assert samples[(f"microscheduler_gpu_{name}", zero_labels)] == value, name
    one_labels = ("local", "1", "GPU-node-c-0001", "NVIDIA A100-SXM4-80GB")
    assert ("microscheduler_gpu_memory_used_bytes", one_labels) in samples
    assert ("microscheduler_gpu_power_watts", one_labels) not in samples  # not exported
    assert not any("node-d" in "".join(labels) for _, labels in samples)


async def test_old_samples_show_as_stale(tmp_path: Path) -> None:
    async with fake_prometheus(*dcgm_gpu(0)) as prometheus:
        prometheus.sample_age_s = 60.0
        async with gateway(settings_for(prometheus, tmp_path)) as gw:
            status = await until(lambda: gpu_status(gw, up=True))
    assert status["stale"] is True
    assert status["age_s"] == pytest.approx(60, abs=3)


async def test_prometheus_going_away_shows_like_a_lost_probe_and_recovers(tmp_path: Path) -> None:
    async with (
        fake_prometheus(*dcgm_gpu(0)) as prometheus,
        gateway(settings_for(prometheus, tmp_path)) as gw,
    ):
        await until(lambda: gpu_status(gw, up=True))
        await prometheus.go_down()
        down = await until(lambda: gpu_status(gw, up=False))
        assert down["reason"] == "unreachable"
        assert down["error"].startswith(
            f"Prometheus at {prometheus.url} is unreachable (ConnectError: "
        )
        assert down["gpus"], "the last good snapshot stays visible while the probe is down"
        assert await until(lambda: metric_line(gw, 'microscheduler_gpu_probe_up{host="local"} 0.0'))
        await prometheus.come_back()
        up = await until(lambda: gpu_status(gw, up=True))
        assert up["error"] is None
        assert await until(lambda: metric_line(gw, 'microscheduler_gpu_probe_up{host="local"} 1.0'))
        prometheus.unavailable = True
        busy = await until(lambda: gpu_status(gw, up=False))
        assert busy["reason"] == "bad_response"
        assert busy["error"] == (
            f"Prometheus at {prometheus.url} answered 503: timeout: query timed out in "
            "expression evaluation"
        )
        prometheus.unavailable = False
        prometheus.series = []

        async def no_data() -> dict[str, Any] | None:
            status = await gpu_status(gw, up=False)
            return status if status is not None and status["reason"] == "no_data" else None

        empty = await until(no_data)
        assert "has no DCGM_FI_DEV_FB_USED/DCGM_FI_DEV_FB_FREE sample" in empty["error"]
