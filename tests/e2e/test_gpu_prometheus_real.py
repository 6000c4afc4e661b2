"""The Prometheus GPU probe against a real Prometheus (the Debian `prometheus` package)
scraping a dcgm-exporter stand-in every second: the probe reads what the stand-in
Prometheus of the other tests would give, the stand-in answers the same query in the same
shape, and an exporter that stops shows as samples growing old, then as no data."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from app.gpu.poller import GpuMonitor
from app.gpu.prometheus import PrometheusSource
from app.gpu.telemetry import MIB, GpuSnapshot, ProbeError
from app.settings import PrometheusProbeConfig
from tests.e2e.conftest import require_tool
from tests.fakes.processes import free_port, stop, wait_for
from tests.fakes.prometheus import Series, dcgm_gpu, exposition, fake_prometheus
from tests.fakes.servers import serve_app
from tests.fakes.waits import until

pytestmark = pytest.mark.e2e

SERIES = [
    *dcgm_gpu(0, used_mib=1000, free_mib=79000, reserved_mib=500),
    *dcgm_gpu(1, used_mib=30000, free_mib=50000, power_w=None),
]


def exporter(series: list[Series]) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=exposition(series), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


@contextlib.contextmanager
def real_prometheus(target: str, tmp_path: Path) -> Iterator[str]:
    binary = require_tool("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: dcgm-exporter\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/-/ready", timeout_s=30, proc=proc)
        yield url
    finally:
        stop(proc)


def shape(body: dict[str, Any]) -> list[tuple[str, tuple[str, ...], str]]:
    """What the client relies on: resultType, each series' label names, value types."""
    data = body["data"]
    return sorted(
        (
            data["resultType"],
            tuple(sorted(series["metric"])),
            type(series["values"][-1][0]).__name__ + "/" + type(series["values"][-1][1]).__name__,
        )
        for series in data["result"]
    )


async def test_the_probe_reads_a_real_prometheus_as_it_reads_the_stand_in(tmp_path: Path) -> None:
    async with serve_app(exporter(SERIES)) as exporter_url:
        target = exporter_url.removeprefix("http://")
        with real_prometheus(target, tmp_path) as url:
            config = PrometheusProbeConfig(
                url=url, selector='{Hostname="node-c"}', query_interval_s=0, lookback_s=30
            )
            source = PrometheusSource(config)

            async def sampled() -> GpuSnapshot | None:
                try:
                    return await source.sample()
                except ProbeError:
                    return None

            snapshot = await until(sampled, timeout_s=20, what="a first scrape of the exporter")
            zero, one = snapshot.gpus
            assert (zero.uuid, zero.name) == ("GPU-node-c-0000", "NVIDIA A100-SXM4-80GB")
            assert (zero.total_bytes, zero.used_bytes) == (80500 * MIB, 1500 * MIB)
            assert (zero.temperature_c, zero.power_w) == (41, 87.5)
            assert one.power_w is None
            assert snapshot.driver_version == "550.54.15"
            assert time.time() - snapshot.taken_at_wall < 5

            async with (
                httpx.AsyncClient(base_url=url) as real,
                fake_prometheus(*SERIES) as stand_in,
                httpx.AsyncClient(base_url=stand_in.url) as fake,
            ):
                query = {"query": source.query}
                answers = [(await c.get("/api/v1/query", params=query)) for c in (real, fake)]
                assert shape(answers[0].json()) == shape(answers[1].json())
                bad = {"query": "DCGM_FI_DEV_FB_USED{"}
                errors = [(await c.get("/api/v1/query", params=bad)) for c in (real, fake)]
                assert [e.status_code for e in errors] == [400, 400]
                assert [(e.json()["status"], e.json()["errorType"]) for e in errors] == [
                    ("error", "bad_data")
                ] * 2
    await source.close()


async def test_an_exporter_that_stops_shows_as_old_samples_then_no_data(tmp_path: Path) -> None:
    runner = web.AppRunner(exporter(SERIES), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    target = f"127.0.0.1:{runner.addresses[0][1]}"
    with real_prometheus(target, tmp_path) as url:
        config = PrometheusProbeConfig(
            url=url, selector='{Hostname="node-c"}', query_interval_s=0, lookback_s=4
        )
        monitor = GpuMonitor(PrometheusSource(config), poll_interval_s=1, stale_after_s=2.5)

        async def fresh() -> bool:
            return await monitor.poll_once() is not None and not monitor.stale

        await until(fresh, timeout_s=20, what="a fresh sample through the real Prometheus")
        await runner.cleanup()  # the exporter stops: scrapes fail from now on

        async def stale_but_up() -> bool:
            return await monitor.poll_once() is not None and monitor.stale

        await until(stale_but_up, timeout_s=10, what="the last samples to grow old")
        age = monitor.age_s()
        assert age is not None
        assert age > 2.5

        async def no_data() -> str | None:
            await monitor.poll_once()
            return monitor.reason if monitor.reason == "no_data" else None

        assert await until(no_data, timeout_s=10, what="the samples to leave the lookback")
        assert not monitor.up
        await monitor.close()


@pytest.fixture(autouse=True)
def _skip_without_prometheus() -> None:
    require_tool("prometheus")
