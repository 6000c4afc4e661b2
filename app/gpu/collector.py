"""GPU metrics on the app's registry.

`GpuCollector` reads the monitor's last snapshot at scrape time: a scrape never calls
NVML (a hung driver cannot hang `/metrics`). Names are Prometheus-style in base units
(bytes, ratio 0-1, watts, celsius), with dcgm-exporter's label names (`gpu`, `UUID`,
`modelName`) so series join with dcgm-exporter's when both run, and `host`: the machine
(`local`, the gateway's own, or a name in `hosts:`). Every family is always
exposed, with no samples when nothing is known, so HELP and TYPE are there from the
first scrape.

- `microscheduler_gpu_snapshot_age_seconds` has no sample until a first good snapshot
  exists (alert on `absent()` or on `microscheduler_gpu_probe_up == 0`): a NaN would
  compare false in every alert rule and break `max()`/`sum()`.
- A lost GPU exports `microscheduler_gpu_lost 1` and none of its other series: its
  numbers are only the last seen ones, and nothing is scheduled on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.gpu.poller import GpuMonitor
from app.gpu.telemetry import GpuStats
from app.metrics import series_name

GPU_LABELS = ("host", "gpu", "UUID", "modelName")


def _labels(host: str, stats: GpuStats) -> list[str]:
    return [host, str(stats.index), stats.uuid, stats.name]


class GpuCollector(Collector):
    """The GPUs of every host with a probe (`monitors`: host name -> its monitor).
    Registered on `registry` when one is given (else call `registry.register`)."""

    def __init__(
        self, monitors: Mapping[str, GpuMonitor], registry: CollectorRegistry | None = None
    ) -> None:
        self._monitors = dict(monitors)
        if registry is not None:
            registry.register(self)

    def describe(self) -> Iterable[Metric]:
        return self._families(())

    def collect(self) -> Iterable[Metric]:
        return self._families(self._monitors.items())

    def _families(self, monitors: Iterable[tuple[str, GpuMonitor]]) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            series_name("gpu_probe_up"),
            "1 when the host's last GPU sample succeeded, else 0.",
            labels=["host"],
        )
        age = GaugeMetricFamily(
            series_name("gpu_snapshot_age_seconds"),
            "Age of the host's last good GPU sample (no sample until there is one).",
            labels=["host"],
        )

        def family(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(series_name(f"gpu_{name}"), doc, labels=GPU_LABELS)

        used = family("memory_used_bytes", "GPU memory in use (NVML v1: includes reserved).")
        free = family("memory_free_bytes", "GPU memory free.")
        total = family("memory_total_bytes", "GPU memory in total.")
        reserved = family(
            "memory_reserved_bytes", "GPU memory reserved by the driver and firmware (NVML v2)."
        )
        util = family(
            "utilization_ratio", "Fraction of the last sample period a kernel was running (0-1)."
        )
        mem_util = family(
            "memory_utilization_ratio",
            "Fraction of the last sample period device memory was read or written (0-1).",
        )
        temperature = family("temperature_celsius", "GPU core temperature.")
        power = family("power_watts", "GPU power draw.")
        lost = family("lost", "1 when the GPU fell off the bus or cannot be read, else 0.")
        for host, monitor in monitors:
            up.add_metric([host], 1.0 if monitor.up else 0.0)
            age_s = monitor.age_s()
            if age_s is not None:
                age.add_metric([host], age_s)
            snapshot = monitor.snapshot
            for stats in () if snapshot is None else snapshot.gpus:
                labels = _labels(host, stats)
                lost.add_metric(labels, 1.0 if stats.lost else 0.0)
                if stats.lost:
                    continue
                used.add_metric(labels, float(stats.used_bytes))
                free.add_metric(labels, float(stats.free_bytes))
                total.add_metric(labels, float(stats.total_bytes))
                if stats.reserved_bytes is not None:
                    reserved.add_metric(labels, float(stats.reserved_bytes))
                if stats.utilization_gpu_pct is not None:
                    util.add_metric(labels, stats.utilization_gpu_pct / 100.0)
                if stats.utilization_memory_pct is not None:
                    mem_util.add_metric(labels, stats.utilization_memory_pct / 100.0)
                if stats.temperature_c is not None:
                    temperature.add_metric(labels, stats.temperature_c)
                if stats.power_w is not None:
                    power.add_metric(labels, stats.power_w)
        yield from (up, age)
        yield from (used, free, total, reserved, util, mem_util, temperature, power, lost)
