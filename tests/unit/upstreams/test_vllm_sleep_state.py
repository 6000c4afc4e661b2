"""The level a vLLM sleeps at, from `vllm:engine_sleep_state` in its `/metrics`: parsed from
text in vLLM 0.33's format, read from the fake vLLM, and used by the wake of a server found
asleep at gateway start (the lifecycle side is in test_sleep_accounting.py)."""

from __future__ import annotations

import httpx
import pytest

from app.upstreams.vllm import VllmClient
from app.upstreams.vllm_load import parse_vllm_load
from tests.fakes.servers import fake_vllm

# As vllm/v1/metrics/loggers.py (0.33) declares it: gauge `vllm:engine_sleep_state`, labels
# model_name, engine and sleep_state, this help text, one series per state; exposed by
# prometheus_client (`GET /metrics`, vllm/entrypoints/serve/instrumentator/metrics.py).
HELP = (
    "# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; "
    "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
    "discard_all = 1 means sleep level 2.\n"
    "# TYPE vllm:engine_sleep_state gauge\n"
)
MODEL = "Qwen/Qwen3-8B"


def sleep_state(awake: int, offloaded: int, discarded: int, engine: str = "0") -> str:
    """One engine's three series, as `record_sleep_state` leaves them."""
    labels = f'engine="{engine}",model_name="{MODEL}"'
    return (
        f'vllm:engine_sleep_state{{{labels},sleep_state="awake"}} {awake:.1f}\n'
        f'vllm:engine_sleep_state{{{labels},sleep_state="weights_offloaded"}} {offloaded:.1f}\n'
        f'vllm:engine_sleep_state{{{labels},sleep_state="discard_all"}} {discarded:.1f}\n'
    )


def exposition(*engines: str) -> str:
    """A vLLM `/metrics` body: other families around the sleep state, as in a scrape."""
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0\n'
        + HELP
        + "".join(engines)
        + "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.0\n'
    )


@pytest.mark.parametrize(
    ("states", "level"),
    [
        ((1, 0, 0), None),  # awake
        ((0, 1, 0), 1),  # record_sleep_state(1, 1): weights offloaded to host RAM
        ((0, 0, 1), 2),  # record_sleep_state(1, 2): everything discarded
        ((0, 0, 0), 0),  # record_sleep_state(1, 0): paused, or KV cache released
    ],
)
def test_the_sleep_state_gauge_gives_the_level(
    states: tuple[int, int, int], level: int | None
) -> None:
    load = parse_vllm_load(exposition(sleep_state(*states)))
    assert load.sleep_level == level
    assert load.requests_running == 0  # the rest of the scrape is read as before


def test_the_deepest_level_of_any_engine_counts() -> None:
    engines = (sleep_state(0, 1, 0, engine="0"), sleep_state(0, 0, 1, engine="1"))
    assert parse_vllm_load(exposition(*engines)).sleep_level == 2
    half = (sleep_state(1, 0, 0, engine="0"), sleep_state(0, 1, 0, engine="1"))
    assert parse_vllm_load(exposition(*half)).sleep_level == 1


def test_no_gauge_means_not_known() -> None:
    """`--disable-log-stats` leaves vLLM without stat loggers, hence without the gauge."""
    assert parse_vllm_load(exposition()).sleep_level is None
    assert parse_vllm_load("").sleep_level is None


@pytest.mark.parametrize("level", [1, 2])
async def test_the_client_reads_the_level_a_server_sleeps_at(level: int) -> None:
    async with fake_vllm(dev_mode=True) as server, httpx.AsyncClient() as client:
        control = VllmClient(client, server.url)
        assert await control.asleep_level() is None  # awake
        await control.sleep(level)
        assert await control.asleep_level() == level
        await control.wake_up(level=level)
        assert await control.asleep_level() is None


async def test_a_server_whose_metrics_cannot_be_read_has_no_known_level() -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="boom")

    async with httpx.AsyncClient(transport=httpx.MockTransport(broken)) as client:
        assert await VllmClient(client, "http://vllm:8000").asleep_level() is None
