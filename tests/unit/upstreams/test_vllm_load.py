"""Reading a vLLM's load from its /metrics: the parser on real-looking expositions, and
the scrape against respx and real sockets on 127.0.0.1."""

from __future__ import annotations

import socket

import httpx
import pytest
import respx

from app.upstreams.vllm import VllmClient
from app.upstreams.vllm_load import (
    BackendLoad,
    MetricsParseError,
    ScrapeError,
    parse_vllm_load,
)
from tests.fakes.servers import fake_vllm

# The shape of a vLLM 0.10 (V1 engine) /metrics, trimmed: process and python collectors,
# HTTP metrics, counters with _total and _created, histograms, an info gauge.
V1_TEXT = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12034.0
python_gc_objects_collected_total{generation="1"} 3411.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 2.147483648e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen2.5-7b"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen2.5-7b"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen2.5-7b"} 0.4217
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="qwen2.5-7b"} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen2.5-7b"} 48211.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="qwen2.5-7b"} 1.7371e+09
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="qwen2.5-7b"} 212.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="qwen2.5-7b"} 9.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="qwen2.5-7b"} 150.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="qwen2.5-7b"} 221.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="qwen2.5-7b"} 221.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="qwen2.5-7b"} 31.4
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="27718"} 1.0
# HELP http_requests_total Total number of requests by method, status and handler.
# TYPE http_requests_total counter
http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 221.0
"""

OLD_TEXT = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.75
"""

TWO_ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.95
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.01
"""


def test_v1_exposition() -> None:
    assert parse_vllm_load(V1_TEXT) == BackendLoad(
        kv_cache_usage_ratio=0.4217, requests_running=3, requests_waiting=1
    )


def test_old_images_use_gpu_cache_usage_perc() -> None:
    assert parse_vllm_load(OLD_TEXT) == BackendLoad(0.75, 2, 0)


def test_two_engines_sum_requests_and_take_the_fullest_kv_cache() -> None:
    # The new name wins over the old one when both are exposed.
    assert parse_vllm_load(TWO_ENGINES) == BackendLoad(0.95, 6, 5)


def test_missing_metrics_are_none() -> None:
    text = "\n".join(line for line in V1_TEXT.splitlines() if "num_requests_waiting" not in line)

    assert parse_vllm_load(text) == BackendLoad(0.4217, 3, None)
    assert parse_vllm_load("") == BackendLoad(None, None, None)
    assert parse_vllm_load("# HELP up x\n# TYPE up gauge\nup 1\n") == BackendLoad()


def test_nan_values_are_ignored() -> None:
    text = 'vllm:kv_cache_usage_perc{engine="0"} NaN\nvllm:num_requests_running{engine="0"} 1\n'

    assert parse_vllm_load(text) == BackendLoad(None, 1, None)


def test_a_metric_whose_name_only_starts_like_a_wanted_one_is_not_counted() -> None:
    text = (
        "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 7\n'
        'vllm:num_requests_waiting{engine="0"} 2\n'
    )

    assert parse_vllm_load(text) == BackendLoad(None, None, 2)


def test_a_broken_line_among_metrics_we_do_not_read_is_still_an_error() -> None:
    text = V1_TEXT.replace("# HELP http_requests_total", "<hr>\n# HELP http_requests_total")

    with pytest.raises(MetricsParseError, match="invalid line '<hr>'"):
        parse_vllm_load(text)


@pytest.mark.parametrize(
    "garbage",
    [
        "<html><body><h1>502 Bad Gateway</h1></body></html>",
        '{"detail": "Not Found"}',
        'vllm:num_requests_running{engine="0" 3.0',
        'vllm:num_requests_running{engine="0"} three\n',
    ],
)
def test_garbage_is_a_parse_error(garbage: str) -> None:
    with pytest.raises(MetricsParseError, match="not Prometheus text exposition") as caught:
        parse_vllm_load(garbage)

    assert isinstance(caught.value, ValueError)
    assert repr(garbage.lstrip()[:20])[:-1] in str(caught.value)


# -- VllmClient.load ----------------------------------------------------------------------

URL = "http://vllm.test:8000"


async def test_scrape_good_with_headers() -> None:
    async with httpx.AsyncClient() as client:
        with respx.mock(assert_all_called=True) as router:
            route = router.get(f"{URL}/metrics", headers={"Authorization": "Bearer k"}).mock(
                return_value=httpx.Response(200, text=V1_TEXT)
            )

            vllm = VllmClient(client, f"{URL}/", headers={"Authorization": "Bearer k"})
            load = await vllm.load(timeout_s=2)

    assert load == BackendLoad(0.4217, 3, 1)
    assert route.call_count == 1


async def test_scrape_status_error() -> None:
    async with httpx.AsyncClient() as client:
        with respx.mock() as router:
            router.get(f"{URL}/metrics").mock(return_value=httpx.Response(500, text="boom"))

            with pytest.raises(ScrapeError) as caught:
                await VllmClient(client, URL).load(timeout_s=2)

    assert caught.value.kind == "status"
    assert str(caught.value) == f"GET {URL}/metrics answered HTTP 500"


async def test_scrape_parse_error() -> None:
    async with httpx.AsyncClient() as client:
        with respx.mock() as router:
            router.get(f"{URL}/metrics").mock(
                return_value=httpx.Response(200, text="<html>hello</html>")
            )

            with pytest.raises(ScrapeError) as caught:
                await VllmClient(client, URL).load(timeout_s=2)

    assert caught.value.kind == "parse"
    assert "not Prometheus text exposition" in str(caught.value)


async def test_scrape_timeout() -> None:
    async with httpx.AsyncClient() as client:
        with respx.mock() as router:
            router.get(f"{URL}/metrics").mock(side_effect=httpx.ReadTimeout("slow"))

            with pytest.raises(ScrapeError) as caught:
                await VllmClient(client, URL).load(timeout_s=1.5)

    assert caught.value.kind == "timeout"
    assert "timed out after 1.5 s" in str(caught.value)


async def test_scrape_connection_refused_for_real() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with httpx.AsyncClient() as client:
        with pytest.raises(ScrapeError) as caught:
            await VllmClient(client, f"http://127.0.0.1:{port}").load(timeout_s=2)

    assert caught.value.kind == "connect"
    assert f"cannot connect to http://127.0.0.1:{port}/metrics" in str(caught.value)


async def test_scrape_the_fake_vllm_for_real() -> None:
    async with fake_vllm() as server, httpx.AsyncClient() as client:
        load = await VllmClient(client, server.url).load(timeout_s=5)

    assert load == BackendLoad(kv_cache_usage_ratio=0.0, requests_running=0, requests_waiting=0)
