"""Two lazy equals that do not fit together, through the gateway (issue 31, 3): fake vLLM
servers on real ports, the simulated GPU. Requests for both at once: the second model's
start waits for the first's (which learns what it serves after its health check, before
its ready), says so in /status, then takes its turn; both are answered, neither gets
503 backend_no_vram."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.api.test_lifecycle_api import lazy, lifecycle_gateway
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, Gateway
from tests.fakes.waits import until


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def status_of(gw: Gateway, name: str) -> dict[str, Any]:
    response = await gw.client.get("/status")
    assert response.status_code == 200
    views: list[dict[str, Any]] = response.json()["backends"]
    return next(v for v in views if v["name"] == name)


async def test_interleaved_requests_for_two_equals_are_answered_in_turn(tmp_path: Path) -> None:
    port_a, port_b = free_port(), free_port()
    learn_b = asyncio.Event()
    runtimes = {
        "turn-a": FakeVllmRuntime(port_a, models=["model-a"]),
        "turn-b": FakeVllmRuntime(port_b, models=["model-b"], learn_gate=learn_b),
    }
    backends = {  # 20000 + 20000 MiB do not fit in the simulated 32768
        "turn-a": lazy(port_a, models=["model-a"], vram_mib=20000),
        "turn-b": lazy(port_b, models=["model-b"], vram_mib=20000),
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path) as gw:
        request_b = asyncio.create_task(
            gw.client.post("/v1/chat/completions", json=chat("model-b"))
        )
        await asyncio.wait_for(runtimes["turn-b"].learning.wait(), 5)  # healthy, not ready

        request_a = asyncio.create_task(
            gw.client.post("/v1/chat/completions", json=chat("model-a"))
        )

        async def waiting() -> dict[str, Any] | None:
            if request_a.done():  # the old code: 503 backend_no_vram at once
                return {"answered": (await request_a).text}
            view = await status_of(gw, "turn-a")
            return view if view["starting"] else None

        view = await until(waiting, what="turn-a's start to say what it waits for")
        assert view.get("starting") == "waiting for turn-b's start on GPU 0", view
        assert view["state"] == "starting"
        assert view["load"]["phase"] == "waiting_for_turn"
        assert runtimes["turn-a"].starts == 0

        learn_b.set()
        response_b = await asyncio.wait_for(request_b, 10)
        assert response_b.status_code == 200, response_b.text
        assert response_b.json()["model"] == "model-b"
        response_a = await asyncio.wait_for(request_a, 10)  # b's turn over: a's
        assert response_a.status_code == 200, response_a.text
        assert response_a.json()["model"] == "model-a"
        assert (await status_of(gw, "turn-b"))["state"] == "stopped"
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_swaps_total{backend="turn-a",evicted="turn-b"} 1.0' in metrics
