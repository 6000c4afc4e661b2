"""min_resident_s through the gateway: two lazy models that do not fit together on the
simulated GPU, fake vLLM servers on real ports. A request for the second while the first
is protected is held, not refused, and answered once the protection ends; the first keeps
answering meanwhile."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.api.test_lifecycle_api import backend_state, lazy, lifecycle_gateway
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime
from tests.fakes.waits import until

PROTECTED_S = 1.0


def chat(model: str, **fields: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        **fields,
    }


async def test_a_start_is_held_until_the_resident_model_has_had_its_min_resident_s(
    tmp_path: Path,
) -> None:
    port_a, port_b = free_port(), free_port()
    runtimes = {
        "a": FakeVllmRuntime(port_a, models=["model-a"]),
        "b": FakeVllmRuntime(port_b, models=["model-b"]),
    }
    backends = {  # 20000 + 20000 MiB do not fit in the simulated 32768
        "a": lazy(port_a, models=["model-a"], vram_mib=20000, priority=10,
                  min_resident_s=PROTECTED_S),
        "b": lazy(port_b, models=["model-b"], vram_mib=20000, priority=50),
    }  # fmt: skip
    async with lifecycle_gateway(backends, runtimes, tmp_path, wake_notice_s=0.2) as gw:
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_swaps_total{backend="b",evicted="a"} 0.0' in metrics
        assert 'microscheduler_swaps_total{backend="a",evicted="b"}' not in metrics
        assert 'microscheduler_swap_wait_seconds_count{backend="b"} 0.0' in metrics

        assert (
            await gw.client.post("/v1/chat/completions", json=chat("model-a"))
        ).status_code == 200
        a_ready = time.monotonic()
        view = await backend_state(gw, "a")
        assert view["min_resident_s"] == PROTECTED_S
        assert 0 < view["protected_for_s"] <= PROTECTED_S

        request_b = asyncio.create_task(
            gw.client.post("/v1/chat/completions", json=chat("model-b", stream=True))
        )
        view_b = await until(
            lambda: _starting(gw, "b"), what="b's start to say it waits for a's residency"
        )
        assert view_b["starting"].startswith("waiting for VRAM: a is resident for ")
        assert view_b["starting"].endswith("s more (min_resident_s)")
        # Meanwhile a answers its own requests; b is not launched yet.
        served = 0
        while not request_b.done() and time.monotonic() - a_ready < PROTECTED_S * 0.8:
            answer = await gw.client.post("/v1/chat/completions", json=chat("model-a"))
            assert answer.status_code == 200
            served += 1
            await asyncio.sleep(0.05)
        assert served >= 2
        assert runtimes["b"].starts == 0
        assert runtimes["a"].stops == 0

        response = await request_b
        answered_b = time.monotonic()
        assert response.status_code == 200
        assert answered_b - a_ready >= PROTECTED_S * 0.9
        comments = [line for line in response.text.splitlines() if line.startswith(": waking b")]
        assert any("(waiting for VRAM: a is resident for " in c for c in comments), comments
        assert response.text.rstrip().endswith("data: [DONE]")
        assert (await backend_state(gw, "a"))["state"] == "stopped"
        assert (await backend_state(gw, "b"))["protected_for_s"] is None  # b has none
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_swaps_total{backend="b",evicted="a"} 1.0' in metrics
        assert 'microscheduler_swap_wait_seconds_count{backend="b"} 1.0' in metrics
        assert 'microscheduler_backend_stops_total{backend="a",reason="eviction"} 1.0' in metrics


async def _starting(gw: Any, name: str) -> dict[str, Any] | None:
    view = await backend_state(gw, name)
    return view if view["starting"] else None
