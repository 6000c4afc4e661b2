"""`idle_stop_in_s` and `queued` in a backend's view (`/backends`, `/status`): the seconds
until a lazy backend's idle stop, None while nothing counts down."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.api.test_lifecycle_api import backend_state, lazy, lifecycle_gateway, pinned
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, chat, until_backend


async def test_the_idle_countdown_runs_only_while_a_lazy_backend_is_ready_and_idle(
    tmp_path: Path,
) -> None:
    lazy_port, pinned_port = free_port(), free_port()
    runtimes = {
        "lazy": FakeVllmRuntime(lazy_port, models=["lazy-model"], ttft=0.5),
        "pinned": FakeVllmRuntime(pinned_port, models=["pinned-model"]),
    }
    backends = {"lazy": lazy(lazy_port, idle_ttl_s=300), "pinned": pinned(pinned_port)}
    async with lifecycle_gateway(backends, runtimes, tmp_path) as gw:
        stopped = await backend_state(gw, "lazy")
        assert (stopped["state"], stopped["idle_stop_in_s"]) == ("stopped", None)
        request = asyncio.create_task(
            gw.client.post("/v1/chat/completions", json=chat("lazy-model"))
        )
        busy = await until_backend(gw, "lazy", state="ready", in_flight=1)
        assert busy["idle_stop_in_s"] is None  # a request in flight: no countdown
        assert (await request).status_code == 200
        idle = await backend_state(gw, "lazy")
        assert 295 < idle["idle_stop_in_s"] <= 300
        assert (await backend_state(gw, "pinned"))["idle_stop_in_s"] is None
        status = (await gw.client.get("/status")).json()
        view = next(b for b in status["backends"] if b["name"] == "lazy")
        assert 295 < view["idle_stop_in_s"] <= 300
        assert view["queued"] == 0
