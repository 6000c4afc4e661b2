"""PrometheusSource against the stand-in Prometheus (tests/fakes/prometheus.py) on a real
port: what a sample reads, how old it is, and every way the query can fail."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from app.gpu.poller import GpuMonitor
from app.gpu.prometheus import PrometheusSource
from app.gpu.telemetry import MIB, ProbeError
from app.settings import PrometheusProbeConfig
from tests.fakes.prometheus import FakePrometheus, dcgm_gpu, fake_prometheus

NODE_C = '{Hostname="node-c"}'


def source(prometheus: FakePrometheus, **config: object) -> PrometheusSource:
    fields: dict[str, object] = {
        "url": prometheus.url,
        "selector": NODE_C,
        "query_interval_s": 0,
        "timeout_s": 1.0,
        **config,
    }
    return PrometheusSource(PrometheusProbeConfig.model_validate(fields))


async def failure(src: PrometheusSource) -> ProbeError:
    with pytest.raises(ProbeError) as caught:
        await src.sample()
    return caught.value


async def test_a_sample_reads_the_selected_hosts_gpus_from_one_query() -> None:
    async with fake_prometheus(
        *dcgm_gpu(0, used_mib=1000, free_mib=79000, reserved_mib=500),
        *dcgm_gpu(1, used_mib=40000, free_mib=40000, power_w=None),
        *dcgm_gpu(0, host="node-d"),  # another host: not selected
    ) as prometheus:
        src = source(prometheus)
        snapshot = await src.sample()
        await src.close()
    assert snapshot.source == "prometheus"
    assert [g.index for g in snapshot.gpus] == [0, 1]
    zero, one = snapshot.gpus
    assert zero.uuid == "GPU-node-c-0000"
    assert zero.name == "NVIDIA A100-SXM4-80GB"
    assert zero.total_bytes == 80500 * MIB
    assert zero.used_bytes == 1500 * MIB
    assert zero.free_mib == 79000
    assert (zero.utilization_gpu_pct, zero.utilization_memory_pct) == (35, 10)
    assert (zero.temperature_c, zero.power_w) == (41, 87.5)
    assert one.power_w is None  # the exporter did not export it: None, never 0
    assert snapshot.driver_version == "550.54.15"
    (query,) = prometheus.queries
    assert query.startswith('{__name__=~"DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE|')
    assert query.endswith(',Hostname="node-c"}[120s]')


async def test_the_snapshot_is_as_old_as_the_samples_so_staleness_shows_it() -> None:
    async with fake_prometheus(*dcgm_gpu(0)) as prometheus:
        prometheus.sample_age_s = 40.0
        monitor = GpuMonitor(source(prometheus), poll_interval_s=1, stale_after_s=30)
        snapshot = await monitor.read()
        assert snapshot is not None
        assert time.time() - snapshot.taken_at_wall == pytest.approx(40, abs=2)
        age = monitor.age_s()
        assert age is not None
        assert age == pytest.approx(40, abs=2)
        assert monitor.up
        assert monitor.stale  # up, but older than stale_after_s
        prometheus.sample_age_s = 0.0
        await monitor.poll_once()
        assert not monitor.stale
        await monitor.close()


async def test_samples_older_than_the_lookback_fail_as_no_data() -> None:
    async with fake_prometheus(*dcgm_gpu(0)) as prometheus:
        prometheus.sample_age_s = 200.0
        src = source(prometheus, lookback_s=120)
        error = await failure(src)
        await src.close()
    assert error.reason == "no_data"
    assert str(error) == (
        f"Prometheus at {prometheus.url} has no DCGM_FI_DEV_FB_USED/DCGM_FI_DEV_FB_FREE sample "
        f"for {NODE_C} in the last 120 s (is dcgm-exporter scraped, and does "
        "gpu.prometheus.selector match its labels?)"
    )


async def test_a_selector_matching_nothing_fails_as_no_data() -> None:
    async with fake_prometheus(*dcgm_gpu(0, host="node-d")) as prometheus:
        src = source(prometheus)
        error = await failure(src)
        await src.close()
    assert error.reason == "no_data"


async def test_prometheus_down_fails_naming_the_url_and_recovers() -> None:
    async with fake_prometheus(*dcgm_gpu(0)) as prometheus:
        src = source(prometheus)
        await src.sample()
        await prometheus.go_down()
        error = await failure(src)
        assert error.reason == "unreachable"
        assert str(error).startswith(
            f"Prometheus at {prometheus.url} is unreachable (ConnectError: "
        )
        await prometheus.come_back()
        assert (await src.sample()).gpus
        await src.close()


async def test_an_error_answer_is_reported_with_its_status_and_error_type() -> None:
    async with fake_prometheus(*dcgm_gpu(0)) as prometheus:
        prometheus.unavailable = True
        src = source(prometheus)
        error = await failure(src)
        await src.close()
    assert error.reason == "bad_response"
    assert str(error) == (
        f"Prometheus at {prometheus.url} answered 503: timeout: query timed out in "
        "expression evaluation"
    )


async def test_a_slow_prometheus_times_out() -> None:
    async with fake_prometheus(*dcgm_gpu(0)) as prometheus:
        prometheus.delay_s = 2.0
        src = source(prometheus, timeout_s=0.1)
        error = await failure(src)
        await src.close()
    assert error.reason == "timeout"
    assert str(error) == f"Prometheus at {prometheus.url} did not answer within 0.1 s"


async def test_the_bearer_token_comes_from_the_named_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with fake_prometheus(*dcgm_gpu(0)) as prometheus:
        src = source(prometheus, bearer_token_env="PROM_TOKEN", headers={"X-Scope-OrgID": "t1"})
        monkeypatch.delenv("PROM_TOKEN", raising=False)
        error = await failure(src)
        assert error.reason == "no_permission"
        assert "PROM_TOKEN" in str(error)
        assert prometheus.queries == []  # nothing sent without the token
        monkeypatch.setenv("PROM_TOKEN", "s3cret")
        await src.sample()
        await src.close()
    (headers,) = prometheus.headers
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["X-Scope-OrgID"] == "t1"


async def test_queries_are_spaced_by_the_query_interval() -> None:
    async with fake_prometheus(*dcgm_gpu(0)) as prometheus:
        src = source(prometheus, query_interval_s=60)
        first = await src.sample()
        assert await src.sample() is first  # the arbiter polling: no new query
        assert len(prometheus.queries) == 1
        await prometheus.go_down()
        assert await src.sample() is first  # nothing new asked within the interval
        await src.close()


async def test_a_failed_sample_logs_one_line_naming_the_url_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with fake_prometheus(*dcgm_gpu(0)) as prometheus:
        monitor = GpuMonitor(source(prometheus), poll_interval_s=1, stale_after_s=30)
        await prometheus.go_down()
        with caplog.at_level(logging.INFO, logger="app.gpu"):
            await monitor.poll_once()
            await monitor.poll_once()
        await monitor.close()
    (record,) = caplog.records
    assert record.exc_info is None
    assert record.getMessage().startswith(
        f"gpu probe down host=local source=prometheus reason=unreachable error=Prometheus at "
        f"{prometheus.url} is unreachable (ConnectError: "
    )


# -- the stand-in follows the documented API (not this client) ---------------------------


async def test_the_stand_in_answers_bad_queries_with_the_documented_error() -> None:
    async with (
        fake_prometheus(*dcgm_gpu(0)) as prometheus,
        httpx.AsyncClient(base_url=prometheus.url) as client,
    ):
        bad = await client.get("/api/v1/query", params={"query": "DCGM_FI_DEV_FB_USED{"})
        missing = await client.get("/api/v1/query")
        instant = await client.post(
            "/api/v1/query", data={"query": "DCGM_FI_DEV_FB_USED", "time": "1764108000.5"}
        )
    assert bad.status_code == 400
    assert bad.json()["status"] == "error"
    assert bad.json()["errorType"] == "bad_data"
    assert missing.status_code == 400
    # An instant vector carries the evaluation time, not the sample's own timestamp.
    (series,) = instant.json()["data"]["result"]
    assert instant.json()["data"]["resultType"] == "vector"
    assert series["value"] == [1764108000.5, "1024"]
    assert series["metric"]["Hostname"] == "node-c"
