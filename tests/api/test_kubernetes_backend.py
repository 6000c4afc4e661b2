"""A lazy kubernetes backend through the gateway in process: the stand-in API server scales
the workload and flips its endpoint ready; the fake vLLM answers behind the "Service"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.fakes.kube_api import FakeKube, fake_kube, write_kubeconfig
from tests.fakes.servers import Gateway, chat, fake_vllm, gateway, gateway_settings, until_backend
from tests.fakes.waits import until


def vllm_url(gw: Gateway) -> str:
    return str(gw.app.state.services.settings.backends["m"].url)


GPU_SHORT = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


@asynccontextmanager
async def kube_gateway(
    tmp_path: Path,
    ready_after_s: float | None,
    *,
    running: bool = False,
    scale: str | None = None,
    health_interval_s: float = 5.0,
    **fields: Any,
) -> AsyncIterator[tuple[Gateway, FakeKube]]:
    async with fake_kube(ready_after_s=ready_after_s) as kube, fake_vllm(models=["m"]) as vllm:
        workload = kube.add_workload("deployments", "vllm-m")
        if running:  # left at 1 replica by an earlier gateway
            kube._scale_to(workload, 1)
            kube.make_ready()
        runtime = {"kind": "kubernetes", "namespace": "llm", "deployment": "vllm-m"}
        if scale is not None:
            runtime["scale"] = scale
        backend = {"url": vllm.url, "models": ["m"], "runtime": runtime, "lifecycle": "lazy"}
        settings = gateway_settings(
            {"m": {**backend, **fields}},
            state_dir=tmp_path / "var",
            reaper_interval_s=0.1,
            health_interval_s=health_interval_s,
            kubernetes={"kubeconfig": write_kubeconfig(tmp_path, kube.url)},
        )
        async with gateway(settings) as gw:
            yield gw, kube


async def test_a_request_is_held_until_the_scale_up_is_ready(tmp_path: Path) -> None:
    async with kube_gateway(tmp_path, ready_after_s=0.8, idle_ttl_s=0.5) as (gw, kube):
        workload = kube.workloads["deployments", "vllm-m"]
        assert workload.replicas == 0
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("m")))
        view = await until_backend(gw, "m", waiting=1)
        assert view["state"] == "starting"
        # vLLM's health passes at once here; the gateway waits for the ready endpoint.
        await until(lambda: workload.replicas == 1, what="the scale-up")

        async def waits_for_the_endpoint() -> str | None:
            view = (await gw.client.get("/backends")).json()["backends"][0]
            starting: str | None = view.get("starting")
            return starting if starting and "0 ready endpoint(s)" in starting else None

        progress = await until(waits_for_the_endpoint, what="the endpoint wait as progress")
        assert progress.startswith(f"health check to {vllm_url(gw)}/health passes; waited ")
        response = await request
        assert response.status_code == 200
        assert response.json()["object"] == "chat.completion"
        view = await until_backend(gw, "m", state="ready")
        assert view["runtime_detail"] == "1 replica(s), 1 ready endpoint(s) in Service vllm-m"
        assert view["last_start_s"] >= 0.7  # held for the endpoint, not just the health check
        # Idle past idle_ttl_s: the lifecycle scales it back to zero.
        await until_backend(gw, "m", state="stopped")
        assert workload.replicas == 0
        assert not kube.pods


async def test_a_pending_pod_is_the_start_progress_and_a_stop_wins(tmp_path: Path) -> None:
    async with kube_gateway(tmp_path, ready_after_s=None) as (gw, kube):
        kube.unschedulable(GPU_SHORT)
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("m")))

        async def explained() -> str | None:
            view = (await gw.client.get("/backends")).json()["backends"][0]
            starting: str | None = view.get("starting")
            return starting if starting and GPU_SHORT in starting else None

        progress = await until(explained, what="the FailedScheduling message as start progress")
        assert "0 ready endpoint(s) in Service vllm-m: pod vllm-m-" in progress
        # A stop during the start: the start task ends first, then the scale to 0 is the
        # last write, so no scale-up is left to fight it.
        stopped = await gw.client.post("/backends/m/stop")
        assert stopped.status_code == 200, stopped.text
        response = await request
        assert response.status_code == 503
        assert kube.workloads["deployments", "vllm-m"].replicas == 0
        assert not kube.pods
        patches = [c for c in kube.calls if c[0] == "PATCH"]
        assert len(patches) == 2  # one scale-up, one scale-down
        # Nothing is left that could patch later: the start task ended before the stop.
        start = gw.app.state.services.backends["m"]._start_task
        assert start is None or start.done()


async def test_a_workload_left_running_is_adopted_without_a_patch(tmp_path: Path) -> None:
    async with kube_gateway(tmp_path, ready_after_s=None, running=True) as (gw, kube):
        view = await until_backend(gw, "m", state="ready")
        assert view["runtime_detail"] == "1 replica(s), 1 ready endpoint(s) in Service vllm-m"
        assert not [c for c in kube.calls if c[0] == "PATCH"]
        response = await gw.client.post("/v1/chat/completions", json=chat("m"))
        assert response.status_code == 200


async def test_the_gateways_own_gpu_yield_leaves_a_cluster_backend_alone(tmp_path: Path) -> None:
    async with kube_gateway(tmp_path, ready_after_s=0.0, running=True) as (gw, kube):
        await until_backend(gw, "m", state="ready")
        body = (await gw.client.post("/vram/yield", json={"include_pinned": True})).json()
        assert "m" not in body["blocked"] + body["stopped"] + body["slept"]
        assert kube.workloads["deployments", "vllm-m"].replicas == 1
        response = await gw.client.post("/v1/chat/completions", json=chat("m"))
        assert response.status_code == 200  # not blocked by the yield
        assert (await gw.client.post("/vram/restore")).status_code == 200


OWNER_WAIT = "waiting for its owner (KEDA/HPA) to scale deployment llm/vllm-m up: 0 replicas"
WAKE_WAITING = 'microscheduler_requests_waiting{backend="m",reason="wake"}'


async def wake_waiting(gw: Gateway) -> str:
    """The `requests_waiting{reason="wake"}` sample of backend m, as /metrics shows it."""
    text = (await gw.client.get("/metrics")).text
    return next(line for line in text.splitlines() if line.startswith(WAKE_WAITING))


async def test_scale_external_holds_a_request_until_its_owner_scales_it_up(
    tmp_path: Path,
) -> None:
    async with kube_gateway(tmp_path, ready_after_s=0.1, scale="external") as (gw, kube):
        workload = kube.workloads["deployments", "vllm-m"]
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("m")))
        view = await until_backend(gw, "m", waiting=1, state="starting")

        async def owner_wait() -> str | None:
            view = (await gw.client.get("/backends")).json()["backends"][0]
            starting: str | None = view.get("starting")
            return starting if starting and OWNER_WAIT in starting else None

        progress = await until(owner_wait, what="the wait for the owner as start progress")
        assert progress.startswith(f"health check to {vllm_url(gw)}/health passes; waited ")
        assert progress.endswith(f" s: {OWNER_WAIT}")
        # What KEDA's Prometheus trigger scales on: one request held for the wake.
        assert await wake_waiting(gw) == f"{WAKE_WAITING} 1.0"
        assert not request.done()
        assert workload.replicas == 0  # the gateway did not scale it up
        kube._scale_to(workload, 1)  # the owner (KEDA) scales it up, as it would
        response = await request
        assert response.status_code == 200
        assert response.json()["object"] == "chat.completion"
        view = await until_backend(gw, "m", state="ready")
        assert view["runtime_detail"] == "1 replica(s), 1 ready endpoint(s) in Service vllm-m"
        assert view["runtime"].endswith(", scaled by its owner")
        assert await wake_waiting(gw) == f"{WAKE_WAITING} 0.0"
        # An admin stop: the gateway stops sending it requests; the pods are the owner's.
        stopped = await gw.client.post("/backends/m/stop")
        assert stopped.status_code == 200, stopped.text
        view = await until_backend(gw, "m", state="stopped")
        assert view["reason"] == "stopped by the gateway (admin)"
        assert workload.replicas == 1
        assert kube.pods
        # Its next request finds it running: ready again without a write.
        response = await gw.client.post("/v1/chat/completions", json=chat("m"))
        assert response.status_code == 200
        assert [c for c in kube.calls if c[0] == "PATCH"] == []


async def test_scaled_to_0_by_its_owner_it_is_stopped_not_failed_and_wakes_again(
    tmp_path: Path,
) -> None:
    async with kube_gateway(
        tmp_path, ready_after_s=0.1, running=True, scale="external", health_interval_s=0.05
    ) as (gw, kube):
        workload = kube.workloads["deployments", "vllm-m"]
        await until_backend(gw, "m", state="ready")  # adopted as it runs
        kube._scale_to(workload, 0)  # idle: the owner (KEDA's cooldown) scales it to 0
        view = await until_backend(gw, "m", state="stopped")
        assert view["reason"] == (
            "scaled to 0 by its owner; the next request waits for it to scale up"
        )
        assert view["runtime_detail"] == OWNER_WAIT
        # The next request is held again, until the owner scales it up once more.
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("m")))
        await until_backend(gw, "m", waiting=1, state="starting")
        assert await wake_waiting(gw) == f"{WAKE_WAITING} 1.0"
        kube._scale_to(workload, 1)
        response = await request
        assert response.status_code == 200
        await until_backend(gw, "m", state="ready")
        # Adopted, owner-stopped, woken: the gateway never wrote its replica count.
        assert [c for c in kube.calls if c[0] == "PATCH"] == []


async def test_scale_external_start_times_out_naming_the_owner_it_waited_for(
    tmp_path: Path,
) -> None:
    """Pinned with scale: external: started at once, it waits for the owner (an HPA with
    minReplicas 1 would run it); none scales it up within start_timeout_s: failed, naming
    what it waited for, still without a write."""
    async with kube_gateway(
        tmp_path, ready_after_s=0.1, scale="external", lifecycle="pinned", start_timeout_s=0.3
    ) as (gw, kube):
        view = await until_backend(gw, "m", state="failed")
        assert view["reason"] == f"not ready 0.3s after start (start_timeout_s), still {OWNER_WAIT}"
        assert [c for c in kube.calls if c[0] == "PATCH"] == []
