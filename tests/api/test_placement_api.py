"""Many GPUs in one box (issue 37), through the gateway on a simulated 2 x 24 GiB box with
fake vLLM servers on real ports: `gpus: auto` starts land on the GPUs with room, by the
host's `gpu.placement:`; a start that fits nowhere evicts where eviction frees most; a
tensor-parallel model takes both GPUs; a yield of one GPU touches only what sits there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.api.test_lifecycle_api import backend_state, lazy, lifecycle_gateway, pinned
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, until_backend

GIB = 1024
BOX = {"probe": "sim", "sim": {"total_mib": 24 * GIB, "count": 2}}


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def auto(port: int, model: str, mib: int, **fields: Any) -> dict[str, Any]:
    return lazy(port, models=[model], vram_mib=mib, gpus="auto", **fields)


def fleet(*names: str) -> tuple[dict[str, int], dict[str, FakeVllmRuntime]]:
    ports = {name: free_port() for name in names}
    return ports, {name: FakeVllmRuntime(ports[name], models=[name]) for name in names}


async def ask(gw: Any, model: str) -> None:
    response = await gw.client.post("/v1/chat/completions", json=chat(model))
    assert response.status_code == 200, response.text


async def test_two_14_gib_models_land_on_different_gpus(tmp_path: Path) -> None:
    ports, runtimes = fleet("a", "b")
    backends = {n: auto(ports[n], n, 14 * GIB) for n in ports}
    async with lifecycle_gateway(backends, runtimes, tmp_path, gpu=BOX) as gw:
        await ask(gw, "a")
        await ask(gw, "b")
        assert runtimes["a"].started_on == [(0,)]
        assert runtimes["b"].started_on == [(1,)]
        assert runtimes["a"].stops == runtimes["b"].stops == 0  # both stay
        assert (await backend_state(gw, "b"))["state"] == "ready"


async def test_a_third_that_fits_nowhere_evicts_on_the_gpu_where_eviction_frees_most(
    tmp_path: Path,
) -> None:
    ports, runtimes = fleet("a", "b", "c", "p")
    backends = {
        "p": pinned(ports["p"], models=["p"], vram_mib=2 * GIB, gpus=[0]),
        **{n: auto(ports[n], n, 14 * GIB) for n in ("a", "b", "c")},
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path, gpu=BOX) as gw:
        await ask(gw, "a")  # pack: GPU 0, beside the pinned 2 GiB
        await ask(gw, "b")  # GPU 0 has 8 GiB left: GPU 1
        await ask(gw, "a")  # a used last: b is the least recently used
        await ask(gw, "c")
        # Evicting a would leave 8 GiB on GPU 0 (the pinned model stays), evicting b 10.
        assert runtimes["c"].started_on == [(1,)]
        assert (await backend_state(gw, "b"))["state"] == "stopped"
        assert (await backend_state(gw, "a"))["state"] == "ready"
        assert runtimes["a"].stops == 0
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_swaps_total{backend="c",evicted="b"} 1.0' in metrics


async def test_a_tensor_parallel_model_gets_both_gpus(tmp_path: Path) -> None:
    ports, runtimes = fleet("small", "tp")
    backends = {
        "small": auto(ports["small"], "small", 4 * GIB),
        "tp": auto(ports["tp"], "tp", 12 * GIB, tensor_parallel_size=2, priority=60),
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path, gpu=BOX) as gw:
        await ask(gw, "small")
        await ask(gw, "tp")  # 12 GiB on each GPU: fits beside the small one
        assert runtimes["tp"].started_on == [(0, 1)]
        assert runtimes["small"].stops == 0


async def test_pack_and_spread_place_a_small_model_differently(tmp_path: Path) -> None:
    placed = {}
    for policy in ("pack", "spread"):
        ports, runtimes = fleet("big", "small")
        backends = {
            "big": auto(ports["big"], "big", 14 * GIB),
            "small": auto(ports["small"], "small", 4 * GIB),
        }
        box = {**BOX, "placement": policy}
        async with lifecycle_gateway(backends, runtimes, tmp_path / policy, gpu=box) as gw:
            await ask(gw, "big")
            await ask(gw, "small")
            assert runtimes["big"].started_on == [(0,)]
            placed[policy] = runtimes["small"].started_on
    assert placed == {"pack": [(0,)], "spread": [(1,)]}


async def test_a_yield_of_gpu_1_touches_only_what_sits_there(tmp_path: Path) -> None:
    ports, runtimes = fleet("a", "b")
    backends = {n: auto(ports[n], n, 14 * GIB) for n in ports}
    async with lifecycle_gateway(backends, runtimes, tmp_path, gpu=BOX) as gw:
        await ask(gw, "a")
        await ask(gw, "b")
        response = await gw.client.post("/vram/yield", json={"gpu": 1})
        assert response.status_code == 200, response.text
        assert response.json()["stopped"] == ["b"]
        assert (await backend_state(gw, "a"))["state"] == "ready"
        assert runtimes["a"].stops == 0
        await gw.client.post("/vram/restore")


async def test_a_server_found_running_is_counted_on_the_gpus_its_runtime_names(
    tmp_path: Path,
) -> None:
    ports, runtimes = fleet("a", "b")
    await runtimes["a"].start((1,))  # it outlived an earlier gateway, on GPU 1
    try:
        backends = {n: auto(ports[n], n, 14 * GIB) for n in ports}
        async with lifecycle_gateway(backends, runtimes, tmp_path, gpu=BOX) as gw:
            view = await until_backend(gw, "a", state="ready")
            assert view["holds_vram"] is True
            await ask(gw, "b")
            assert runtimes["b"].started_on == [(0,)]  # GPU 1 is a's
            assert runtimes["a"].stops == 0
    finally:
        await runtimes["a"].stop()
