"""The event loop's lag is sampled while the app runs, by a task its lifespan owns."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.servers import fake_vllm, gateway, gateway_settings
from tests.fakes.waits import until


def lag_samples(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("microscheduler_event_loop_lag")
        for sample in family.samples
        if not sample.name.endswith("_bucket") and not sample.name.endswith("_created")
    }


async def test_metrics_show_the_loops_lag_while_the_app_runs() -> None:
    async with fake_vllm() as server:
        backend = {"url": server.url, "models": ["m"]}
        async with gateway(gateway_settings({"b": backend})) as gw:

            async def sampled() -> dict[str, float] | None:
                seen = lag_samples((await gw.client.get("/metrics")).text)
                return seen if seen.get("microscheduler_event_loop_lag_seconds_count") else None

            seen = await until(sampled, what="a lag sample in /metrics")
            assert "microscheduler_event_loop_lag_max_seconds" in seen
            assert [t for t in asyncio.all_tasks() if t.get_name() == "event-loop-lag"]
    # The lifespan's end cancelled it.
    assert [t for t in asyncio.all_tasks() if t.get_name() == "event-loop-lag"] == []
