"""The Prometheus GPU probe's pure parts: the query, reading a `/api/v1/query` answer of
dcgm-exporter series into GPUs, and the `gpu.prometheus` settings."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.gpu.prometheus import (
    FB_FREE,
    FB_RESERVED,
    FB_USED,
    GPU_TEMP,
    GPU_UTIL,
    METRICS,
    POWER_USAGE,
    _BadResponse,
    build_query,
    gpus_from,
    readings,
)
from app.gpu.telemetry import MIB, ProbeError
from app.settings import GpuConfig, PrometheusProbeConfig

T0 = 1_764_108_000.0


def labels(gpu: int, host: str = "node-c", **extra: str) -> dict[str, str]:
    # dcgm-exporter's label set (its README example), plus job/instance from the scrape.
    return {
        "gpu": str(gpu),
        "UUID": f"GPU-{host}-{gpu}",
        "pci_bus_id": f"00000000:{gpu + 7:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": "NVIDIA L40S",
        "Hostname": host,
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
        "job": "dcgm",
        "instance": f"{host}:9400",
        **extra,
    }


def series(metric: str, gpu: int, *points: tuple[float, str], **extra: str) -> dict[str, Any]:
    return {
        "metric": {"__name__": metric, **labels(gpu, **extra)},
        "values": [[ts, value] for ts, value in points],
    }


def matrix(*result: dict[str, Any]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix", "result": list(result)}}


def full_gpu(gpu: int, used: str, free: str, ts: float = T0, **extra: str) -> list[dict[str, Any]]:
    return [
        series(FB_USED, gpu, (ts - 15, "1"), (ts, used), **extra),
        series(FB_FREE, gpu, (ts, free), **extra),
        series(FB_RESERVED, gpu, (ts, "512"), **extra),
        series(GPU_UTIL, gpu, (ts, "87"), **extra),
        series(GPU_TEMP, gpu, (ts, "63"), **extra),
        series(POWER_USAGE, gpu, (ts, "212.25"), **extra),
    ]


def test_the_query_reads_every_metric_with_the_selector_and_a_range() -> None:
    names = "|".join(METRICS)
    assert build_query('{Hostname="node-c"}', 120) == (
        f'{{__name__=~"{names}",Hostname="node-c"}}[120s]'
    )
    assert build_query("", 60) == f'{{__name__=~"{names}"}}[60s]'
    assert build_query("{}", 60) == f'{{__name__=~"{names}"}}[60s]'
    assert build_query('{ a="1", b=~"x.*", }', 30) == (
        f'{{__name__=~"{names}",a="1", b=~"x.*"}}[30s]'
    )


def test_two_gpus_are_read_with_reserved_memory_in_used_and_total() -> None:
    body = matrix(*full_gpu(1, "20000", "25000", ts=T0 - 5), *full_gpu(0, "1000", "44000"))
    gpus, oldest, driver = gpus_from(readings(body))
    assert [g.index for g in gpus] == [0, 1]
    zero = gpus[0]
    # MiB as dcgm-exporter exports them; the newest sample of each series counts.
    assert zero.used_bytes == (1000 + 512) * MIB  # used counts reserved, as NVML v1
    assert zero.free_bytes == 44000 * MIB
    assert zero.reserved_bytes == 512 * MIB
    assert zero.total_bytes == (1000 + 44000 + 512) * MIB
    assert zero.free_mib == 44000
    assert (zero.uuid, zero.name) == ("GPU-node-c-0", "NVIDIA L40S")
    assert (zero.utilization_gpu_pct, zero.temperature_c, zero.power_w) == (87, 63, 212.25)
    assert zero.utilization_memory_pct is None  # MEM_COPY_UTIL not in the answer
    assert not zero.lost
    assert gpus[1].used_bytes == (20000 + 512) * MIB
    assert oldest == T0 - 5  # the oldest FB sample: the snapshot is as old as that
    assert driver == "550.54.15"


def test_missing_optional_metrics_are_none_and_total_is_used_plus_free() -> None:
    body = matrix(series(FB_USED, 0, (T0, "100")), series(FB_FREE, 0, (T0, "900")))
    (gpu,), _, _ = gpus_from(readings(body))
    assert gpu.total_bytes == 1000 * MIB
    assert gpu.reserved_bytes is None
    assert gpu.utilization_gpu_pct is None
    assert gpu.temperature_c is None
    assert gpu.power_w is None


def test_non_finite_optional_values_are_none_and_non_finite_memory_marks_the_gpu_lost() -> None:
    body = matrix(
        series(FB_USED, 0, (T0, "100")),
        series(FB_FREE, 0, (T0, "900")),
        series(POWER_USAGE, 0, (T0, "NaN")),
        series(GPU_TEMP, 0, (T0, "+Inf")),
        series(GPU_UTIL, 0, (T0, "-Inf")),
        series(FB_USED, 1, (T0, "NaN")),
        series(FB_FREE, 1, (T0, "100")),
        series(FB_USED, 2, (T0, "100")),  # FB_FREE missing
    )
    zero, one, two = gpus_from(readings(body))[0]
    assert (zero.power_w, zero.temperature_c, zero.utilization_gpu_pct) == (None, None, None)
    assert not zero.lost
    assert one.lost
    assert one.error == f"GPU 1: {FB_USED} is nan"
    assert two.lost
    assert two.error == f"GPU 2: {FB_FREE} is missing"


def test_one_gpu_scraped_twice_takes_the_newest_sample() -> None:
    # The same exporter in two scrape jobs: the same UUID, other job/instance labels.
    body = matrix(
        series(FB_USED, 0, (T0 - 30, "7000")),
        series(FB_USED, 0, (T0, "8000"), job="dcgm-2"),
        series(FB_FREE, 0, (T0, "1000")),
        series(FB_FREE, 0, (T0 - 30, "2000"), job="dcgm-2"),
    )
    (gpu,), oldest, _ = gpus_from(readings(body))
    assert (gpu.used_bytes, gpu.free_bytes) == (8000 * MIB, 1000 * MIB)
    assert oldest == T0


def test_one_gpu_index_on_two_hosts_is_refused_as_an_ambiguous_selector() -> None:
    body = matrix(*full_gpu(0, "1", "2"), *full_gpu(0, "1", "2", host="node-d"))
    with pytest.raises(ProbeError, match="matches more than one GPU 0") as caught:
        gpus_from(readings(body))
    assert caught.value.reason == "ambiguous"
    assert "node-c" in str(caught.value)
    assert "node-d" in str(caught.value)


def test_mig_instances_are_refused() -> None:
    body = matrix(series(FB_USED, 0, (T0, "1"), GPU_I_ID="1", GPU_I_PROFILE="1g.10gb"))
    with pytest.raises(ProbeError, match="MIG") as caught:
        gpus_from(readings(body))
    assert caught.value.reason == "unsupported"


def test_series_without_a_gpu_index_and_other_metrics_are_skipped() -> None:
    body = matrix(
        {"metric": {"__name__": FB_USED, "Hostname": "node-c"}, "values": [[T0, "1"]]},
        series("DCGM_FI_DEV_SM_CLOCK", 0, (T0, "1410")),
    )
    assert readings(body) == []
    assert gpus_from([]) == ([], None, None)


def test_an_instant_vector_is_read_too() -> None:
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"__name__": FB_USED, **labels(0)}, "value": [T0, "5"]}],
        },
    }
    (reading,) = readings(body)
    assert (reading.value, reading.ts) == (5.0, T0)


@pytest.mark.parametrize(
    "body",
    [
        {"status": "error", "errorType": "bad_data", "error": "x"},
        {"status": "success", "data": {"resultType": "scalar", "result": [T0, "1"]}},
        {"status": "success", "data": {"resultType": "matrix", "result": {}}},
        matrix({"metric": {"__name__": FB_USED, "gpu": "0"}, "values": [[T0]]}),
        matrix({"metric": {"__name__": FB_USED, "gpu": "0"}, "values": [[T0, "x"]]}),
        [],
    ],
)
def test_a_body_not_of_the_documented_shape_is_refused(body: object) -> None:
    with pytest.raises(_BadResponse):
        readings(body)


# -- settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "selector",
    ['{Hostname="node-c"}', "{}", '{instance=~"node-c:.*", job!="x",}', "{a='b'}", ""],
)
def test_label_matchers_are_accepted(selector: str) -> None:
    assert PrometheusProbeConfig(url="http://p:9090/", selector=selector).url == "http://p:9090"


@pytest.mark.parametrize(
    ("selector", "problem"),
    [
        ('Hostname="node-c"', "label matchers in braces"),
        ("{Hostname=node-c}", "label matchers in braces"),
        ('{Hostname="node-c"} or vector(1)', "label matchers in braces"),
        ('DCGM_FI_DEV_FB_USED{Hostname="node-c"}', "label matchers in braces"),
        ('{__name__="up"}', "must not match __name__"),
    ],
)
def test_a_selector_that_is_not_label_matchers_is_refused(selector: str, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        PrometheusProbeConfig(url="http://p:9090", selector=selector)


def test_the_prometheus_probe_needs_a_url_and_no_secret_in_headers() -> None:
    with pytest.raises(ValidationError, match=r"needs gpu\.prometheus\.url"):
        GpuConfig(probe="prometheus")
    with pytest.raises(ValidationError, match="Prometheus base URL"):
        PrometheusProbeConfig(url="prometheus:9090")
    with pytest.raises(ValidationError, match="bearer_token_env"):
        PrometheusProbeConfig(url="http://p:9090", headers={"Authorization": "Bearer x"})
    config = GpuConfig.model_validate(
        {"probe": "prometheus", "prometheus": {"url": "http://p:9090", "bearer_token_env": "T"}}
    )
    assert config.prometheus is not None
    assert config.prometheus.bearer_token_env == "T"


def test_the_prometheus_probe_defaults_allow_for_a_scrape_old_sample() -> None:
    config = GpuConfig.model_validate({"probe": "prometheus", "prometheus": {"url": "http://p"}})
    assert (config.stale_after_s, config.reclaim_timeout_s) == (90.0, 90.0)
    kept = GpuConfig.model_validate(
        {"probe": "prometheus", "prometheus": {"url": "http://p"}, "stale_after_s": 20}
    )
    assert (kept.stale_after_s, kept.reclaim_timeout_s) == (20.0, 90.0)
    assert GpuConfig(probe="nvml").stale_after_s == 10.0
