"""The host RAM probe: /proc/meminfo of the gateway's machine (a fixture file) and
node-exporter series of another host through the stand-in Prometheus."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.gpu.host_ram import (
    HostRamMonitor,
    MeminfoSource,
    NodeExporterSource,
    RamReading,
    parse_meminfo,
)
from app.gpu.prometheus import PrometheusSource
from app.gpu.telemetry import ProbeError
from app.settings import PrometheusProbeConfig
from tests.fakes.prometheus import FakePrometheus, fake_prometheus, node_memory

FIXTURE = Path(__file__).parents[2] / "fixtures" / "meminfo_64g.txt"
GIB = 1024**3


def test_meminfo_total_and_available_in_kib() -> None:
    reading = parse_meminfo(FIXTURE.read_text(), now=5.0)
    assert reading.total_bytes == 65536000 * 1024
    assert reading.available_bytes == 40960000 * 1024
    assert (reading.total_mib, reading.available_mib) == (64000, 40000)
    assert reading.taken_at == 5.0


def test_meminfo_without_mem_available_is_a_probe_error() -> None:
    with pytest.raises(ProbeError, match="no MemAvailable"):
        parse_meminfo("MemTotal:  1024 kB\nMemFree:  10 kB\n")


async def test_the_meminfo_source_reads_its_file_and_the_monitor_keeps_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "meminfo"
    path.write_text(FIXTURE.read_text())
    monitor = HostRamMonitor(MeminfoSource(path), host="local", poll_interval_s=1.0)
    reading = await monitor.read()
    assert reading is not None
    assert reading.available_mib == 40000
    assert monitor.up
    assert monitor.error is None
    path.unlink()  # a failed read keeps the last good reading, and says why
    assert await monitor.read() == reading
    assert not monitor.up
    assert monitor.error is not None
    assert "cannot read" in monitor.error


async def test_the_real_proc_meminfo_reads() -> None:
    reading = await MeminfoSource().sample()
    assert 0 < reading.available_bytes <= reading.total_bytes


async def sample(prometheus: FakePrometheus, selector: str) -> RamReading:
    config = PrometheusProbeConfig(url=prometheus.url, query_interval_s=0, timeout_s=1.0)
    client = PrometheusSource(config)  # the GPU probe's, whose owner closes it
    try:
        return await NodeExporterSource(client, selector).sample()
    finally:
        await client.close()


async def test_node_exporter_series_of_the_selected_host() -> None:
    async with fake_prometheus(
        *node_memory(host="node-c", total_bytes=128 * GIB, available_bytes=100 * GIB),
        *node_memory(host="node-d", total_bytes=64 * GIB, available_bytes=1 * GIB),
    ) as prometheus:
        reading = await sample(prometheus, '{instance="node-c:9100"}')
    assert (reading.total_mib, reading.available_mib) == (128 * 1024, 100 * 1024)
    (query,) = prometheus.queries
    assert query == (
        '{__name__=~"node_memory_MemTotal_bytes|node_memory_MemAvailable_bytes",'
        'instance="node-c:9100"}[120s]'
    )


async def test_node_exporter_of_several_hosts_or_none_is_a_probe_error() -> None:
    async with fake_prometheus(
        *node_memory(host="node-c", total_bytes=128 * GIB, available_bytes=100 * GIB),
        *node_memory(host="node-d", total_bytes=64 * GIB, available_bytes=1 * GIB),
    ) as prometheus:
        with pytest.raises(ProbeError, match="several hosts") as caught:
            await sample(prometheus, "")
        assert caught.value.reason == "ambiguous"
        with pytest.raises(ProbeError, match="no node_memory_MemTotal_bytes") as caught:
            await sample(prometheus, '{instance="node-x:9100"}')
        assert caught.value.reason == "no_data"
        assert str(caught.value).startswith(f"Prometheus at {prometheus.url} has no")
