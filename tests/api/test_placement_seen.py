"""Where each backend sits, seen in `/status`, `/backends` and `/metrics` (issue 37, item
4): on a simulated 2 x 24 GiB box, a fixed backend on GPU 0 and a `gpus: auto` one that
admission places on GPU 1 (GPU 0 has no room left for it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.api.test_lifecycle_api import lazy, lifecycle_gateway
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime

TWO_GPUS = {"probe": "sim", "sim": {"total_mib": 24576, "count": 2}}


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def two_models() -> tuple[dict[str, dict[str, Any]], dict[str, FakeVllmRuntime]]:
    port_a, port_b = free_port(), free_port()
    backends = {  # 14000 + 14000 MiB do not fit on one 24576 MiB GPU
        "a": lazy(port_a, models=["model-a"], vram_mib=14000, gpus=[0]),
        "b": lazy(port_b, models=["model-b"], vram_mib=14000, gpus="auto"),
    }
    runtimes = {
        "a": FakeVllmRuntime(port_a, models=["model-a"]),
        "b": FakeVllmRuntime(port_b, models=["model-b"]),
    }
    return backends, runtimes


def by_name(views: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in views}


def where(view: dict[str, Any]) -> tuple[Any, ...]:
    return (view["gpus"], view["last_gpus"], view["placement"], view["placed_why"])


async def test_status_and_backends_say_which_gpus_each_backend_holds_and_why(
    tmp_path: Path,
) -> None:
    backends, runtimes = two_models()
    async with lifecycle_gateway(backends, runtimes, tmp_path, gpu=TWO_GPUS) as gw:
        first = (await gw.client.get("/status")).json()
        assert [(h["name"], h["placement"]) for h in first["hosts"]] == [("local", "pack")]
        before = by_name(first["backends"])
        assert where(before["a"]) == ([], [0], [0], "gpus: in its config")
        assert where(before["b"]) == ([], None, "auto", "not placed yet")

        assert (await gw.client.post("/v1/chat/completions", json=chat("model-a"))).is_success
        assert (await gw.client.post("/v1/chat/completions", json=chat("model-b"))).is_success
        status = by_name((await gw.client.get("/status")).json()["backends"])
        listed = by_name((await gw.client.get("/backends")).json()["backends"])
        for views in (status, listed):
            assert where(views["a"]) == ([0], [0], [0], "gpus: in its config")
            assert where(views["b"]) == ([1], [1], "auto", "GPU 1: 24.0 GiB free, pack")
        assert runtimes["a"].stops == 0  # b went beside it, nothing was evicted

        answer = (await gw.client.post("/backends/b/stop")).json()  # the stop's own view
        stopped = by_name((await gw.client.get("/status")).json()["backends"])["b"]
        for view in (answer, stopped):
            assert where(view) == ([], [1], "auto", "GPU 1: 24.0 GiB free, pack")


async def test_the_backend_gpu_gauge_is_1_where_it_sits_and_0_on_the_gpu_it_left(
    tmp_path: Path,
) -> None:
    backends, runtimes = two_models()
    async with lifecycle_gateway(backends, runtimes, tmp_path, gpu=TWO_GPUS) as gw:
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_backend_gpu{backend="a",gpu="0",host="local"} 0.0' in metrics
        assert 'backend_gpu{backend="b"' not in metrics  # never placed: no GPU to name

        assert (await gw.client.post("/v1/chat/completions", json=chat("model-a"))).is_success
        assert (await gw.client.post("/v1/chat/completions", json=chat("model-b"))).is_success
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_backend_gpu{backend="a",gpu="0",host="local"} 1.0' in metrics
        assert 'microscheduler_backend_gpu{backend="b",gpu="1",host="local"} 1.0' in metrics
        assert 'backend_gpu{backend="b",gpu="0"' not in metrics

        assert (await gw.client.post("/backends/b/stop")).is_success
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_backend_gpu{backend="b",gpu="1",host="local"} 0.0' in metrics
        assert 'microscheduler_backend_gpu{backend="a",gpu="0",host="local"} 1.0' in metrics
