"""The GPU collector and the vLLM load gauges, checked on the exposition text itself."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.gpu.collector import GpuCollector
from app.gpu.poller import GpuMonitor
from app.gpu.telemetry import MIB, GpuSnapshot, GpuStats, ProbeError
from app.upstreams.vllm_load import BackendLoad, VllmLoadMetrics

GIB = 1024 * MIB
GPU_FAMILIES = (
    "microscheduler_gpu_memory_used_bytes",
    "microscheduler_gpu_memory_free_bytes",
    "microscheduler_gpu_memory_total_bytes",
    "microscheduler_gpu_memory_reserved_bytes",
    "microscheduler_gpu_utilization_ratio",
    "microscheduler_gpu_memory_utilization_ratio",
    "microscheduler_gpu_temperature_celsius",
    "microscheduler_gpu_power_watts",
    "microscheduler_gpu_lost",
)
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Source:
    name = "fake"

    def __init__(self, *gpus: GpuStats) -> None:
        self.gpus = gpus
        self.fail: ProbeError | None = None
        self.calls = 0

    async def sample(self) -> GpuSnapshot:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return GpuSnapshot("fake", self.gpus, time.monotonic() - 2.0, time.time() - 2.0)

    async def close(self) -> None:
        return None


FULL = GpuStats(
    index=0,
    uuid="GPU-5d3c1a2b",
    name="NVIDIA GeForce RTX 4090",
    total_bytes=24 * GIB,
    used_bytes=10 * GIB,
    free_bytes=14 * GIB,
    reserved_bytes=500 * MIB,
    utilization_gpu_pct=37.0,
    utilization_memory_pct=12.0,
    temperature_c=54.0,
    power_w=215.5,
)
BARE = GpuStats(  # a board without power, temperature, utilization or v2 memory
    index=1,
    uuid="GPU-bare",
    name="Tesla T4",
    total_bytes=16 * GIB,
    used_bytes=GIB,
    free_bytes=15 * GIB,
)
LOST = GpuStats(3, "GPU-lost", "NVIDIA A10", 24 * GIB, GIB, 23 * GIB, lost=True, error="lost")


def exposition(registry: CollectorRegistry) -> tuple[set[str], Series]:
    text = generate_latest(registry).decode()
    names: set[str] = set()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        for sample in family.samples:
            series[(sample.name, frozenset(sample.labels.items()))] = sample.value
    # HELP and TYPE present for every family (even without samples).
    for name in names:
        assert f"# HELP {name} " in text
        assert f"# TYPE {name} gauge" in text
    return names, series


LOCAL = frozenset({("host", "local")})


def gpu_labels(stats: GpuStats, host: str = "local") -> frozenset[tuple[str, str]]:
    return frozenset(
        {("host", host), ("gpu", str(stats.index)), ("UUID", stats.uuid), ("modelName", stats.name)}
    )


def names_for(series: Series, uuid: str) -> set[str]:
    return {name for name, labels in series if ("UUID", uuid) in labels}


async def test_gpu_series_in_base_units_with_dcgm_labels() -> None:
    source = Source(FULL, BARE, LOST)
    monitor = GpuMonitor(source, poll_interval_s=1, stale_after_s=10)
    registry = CollectorRegistry()
    GpuCollector({"local": monitor}, registry)
    await monitor.read()

    names, series = exposition(registry)

    assert set(GPU_FAMILIES) <= names
    full = gpu_labels(FULL)
    assert series[("microscheduler_gpu_probe_up", LOCAL)] == 1.0
    assert 2.0 <= series[("microscheduler_gpu_snapshot_age_seconds", LOCAL)] < 10.0
    assert series[("microscheduler_gpu_memory_used_bytes", full)] == 10 * GIB
    assert series[("microscheduler_gpu_memory_free_bytes", full)] == 14 * GIB
    assert series[("microscheduler_gpu_memory_total_bytes", full)] == 24 * GIB
    assert series[("microscheduler_gpu_memory_reserved_bytes", full)] == 500 * MIB
    assert series[("microscheduler_gpu_utilization_ratio", full)] == pytest.approx(0.37)
    assert series[("microscheduler_gpu_memory_utilization_ratio", full)] == pytest.approx(0.12)
    assert series[("microscheduler_gpu_temperature_celsius", full)] == 54.0
    assert series[("microscheduler_gpu_power_watts", full)] == 215.5
    assert series[("microscheduler_gpu_lost", full)] == 0.0
    # What a board does not report is absent, never 0.
    assert names_for(series, "GPU-bare") == {
        "microscheduler_gpu_memory_used_bytes",
        "microscheduler_gpu_memory_free_bytes",
        "microscheduler_gpu_memory_total_bytes",
        "microscheduler_gpu_lost",
    }
    # A lost GPU says so, and nothing else (its numbers are old).
    assert names_for(series, "GPU-lost") == {"microscheduler_gpu_lost"}
    assert series[("microscheduler_gpu_lost", gpu_labels(LOST))] == 1.0


async def test_every_family_is_present_before_any_sample() -> None:
    monitor = GpuMonitor(Source(FULL), poll_interval_s=1, stale_after_s=10)
    registry = CollectorRegistry()
    GpuCollector({"local": monitor}, registry)

    names, series = exposition(registry)

    assert {
        "microscheduler_gpu_probe_up",
        "microscheduler_gpu_snapshot_age_seconds",
        *GPU_FAMILIES,
    } <= names
    assert series == {("microscheduler_gpu_probe_up", LOCAL): 0.0}


async def test_probe_down_keeps_the_last_snapshot_and_says_down() -> None:
    source = Source(FULL)
    monitor = GpuMonitor(source, poll_interval_s=1, stale_after_s=10)
    registry = CollectorRegistry()
    GpuCollector({"local": monitor}, registry)
    await monitor.read()
    source.fail = ProbeError("NVML did not answer", reason="timeout")
    await monitor.read()

    _, series = exposition(registry)

    assert series[("microscheduler_gpu_probe_up", LOCAL)] == 0.0
    assert series[("microscheduler_gpu_memory_used_bytes", gpu_labels(FULL))] == 10 * GIB


async def test_a_scrape_never_samples_the_source() -> None:
    source = Source(FULL)
    monitor = GpuMonitor(source, poll_interval_s=1, stale_after_s=10)
    registry = CollectorRegistry()
    GpuCollector({"local": monitor}, registry)
    await monitor.read()

    for _ in range(3):
        generate_latest(registry)

    assert source.calls == 1


def test_collector_declares_its_names() -> None:
    monitor = GpuMonitor(Source(FULL), poll_interval_s=1, stale_after_s=10)
    registry = CollectorRegistry()
    GpuCollector({"local": monitor}, registry)

    with pytest.raises(ValueError, match="Duplicated timeseries"):
        GpuCollector({"local": monitor}, registry)


# -- vLLM load -----------------------------------------------------------------------


def test_declare_creates_only_metrics_up() -> None:
    registry = CollectorRegistry()
    load = VllmLoadMetrics(registry)

    load.declare("qwen")

    names, series = exposition(registry)
    assert {
        "microscheduler_backend_kv_cache_usage_ratio",
        "microscheduler_backend_requests_running",
        "microscheduler_backend_requests_waiting",
        "microscheduler_backend_metrics_up",
    } <= names
    assert series == {("microscheduler_backend_metrics_up", frozenset({("backend", "qwen")})): 0.0}


def test_update_sets_the_load_and_a_failed_scrape_removes_it() -> None:
    registry = CollectorRegistry()
    load = VllmLoadMetrics(registry)
    load.declare("qwen")
    load.declare("llama")
    qwen = frozenset({("backend", "qwen")})
    llama = frozenset({("backend", "llama")})

    load.update("qwen", BackendLoad(0.42, 3, 1))
    load.update("llama", BackendLoad(0.9, 1, 0))
    _, series = exposition(registry)

    assert series[("microscheduler_backend_metrics_up", qwen)] == 1.0
    assert series[("microscheduler_backend_kv_cache_usage_ratio", qwen)] == pytest.approx(0.42)
    assert series[("microscheduler_backend_requests_running", qwen)] == 3.0
    assert series[("microscheduler_backend_requests_waiting", qwen)] == 1.0

    load.update("qwen", None)  # stopped, or the scrape failed
    load.update("llama", BackendLoad(None, 2, None))  # metrics this image lacks
    _, series = exposition(registry)

    assert series[("microscheduler_backend_metrics_up", qwen)] == 0.0
    assert {name for name, labels in series if labels == qwen} == {
        "microscheduler_backend_metrics_up"
    }
    assert series[("microscheduler_backend_metrics_up", llama)] == 1.0
    assert series[("microscheduler_backend_requests_running", llama)] == 2.0
    assert ("microscheduler_backend_kv_cache_usage_ratio", llama) not in series
    assert ("microscheduler_backend_requests_waiting", llama) not in series
