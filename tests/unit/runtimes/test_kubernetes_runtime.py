"""KubernetesRuntime against the stand-in API server (tests/fakes/kube_api.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.runtimes.base import RuntimeFailure
from app.runtimes.kube_api import KubeApi
from app.runtimes.kubernetes import KubernetesRuntime
from app.settings import KubernetesConfig, KubernetesRuntimeConfig
from tests.fakes.kube_api import SA_USER, FakeKube, fake_kube, write_kubeconfig
from tests.fakes.waits import until

GPU_SHORT = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
SCALE = "/apis/apps/v1/namespaces/llm/deployments/vllm/scale"


@dataclass
class Env:
    kube: FakeKube
    api: KubeApi
    tmp_path: Path

    def runtime(self, **fields: Any) -> KubernetesRuntime:
        config = KubernetesRuntimeConfig(
            kind="kubernetes", namespace="llm", **{"deployment": "vllm", **fields}
        )
        return KubernetesRuntime("b", config, self.api)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with fake_kube() as kube:
        kube.add_workload("deployments", "vllm")
        api = KubeApi(KubernetesConfig(kubeconfig=write_kubeconfig(tmp_path, kube.url)), env={})
        try:
            yield Env(kube, api, tmp_path)
        finally:
            await api.aclose()


async def test_start_scales_from_zero_and_is_ready_by_endpointslice(env: Env) -> None:
    runtime = env.runtime()
    assert (await runtime.status()).running is False
    await runtime.start()
    patches = [c for c in env.kube.calls if c[0] == "PATCH"]
    assert patches == [("PATCH", SCALE, "application/merge-patch+json")]
    assert env.kube.workloads["deployments", "vllm"].replicas == 1
    first = await runtime.status()
    assert first.running
    assert first.ready is False
    assert "0 ready endpoint(s)" in first.detail or "not listed yet" in first.detail

    async def ready() -> str | None:
        status = await runtime.status()
        return status.detail if status.ready else None

    detail = await until(ready, what="a ready endpoint")
    assert detail == "1 replica(s), 1 ready endpoint(s) in Service vllm"
    await runtime.start()  # already at 1: no second patch
    assert len([c for c in env.kube.calls if c[0] == "PATCH"]) == 1


async def test_stop_scales_to_zero_and_waits_for_the_pods(env: Env) -> None:
    runtime = env.runtime()
    await runtime.start()
    assert env.kube.pods
    await runtime.stop()
    assert env.kube.workloads["deployments", "vllm"].replicas == 0
    assert not env.kube.pods
    assert (await runtime.status()).detail == "deployment llm/vllm scaled to 0"
    await runtime.stop()  # stopping a stopped workload is no error


async def test_a_late_scale_up_during_the_stop_is_undone(env: Env) -> None:
    """A start cancelled by a stop may have its PATCH land after the stop's: the stop
    checks again and scales to 0 once more, so the workload ends at 0."""
    runtime = env.runtime(stop_timeout_s=2)
    runtime.stop_poll_s = 0.05
    await runtime.start()
    workload = env.kube.workloads["deployments", "vllm"]
    patch = runtime._set_replicas
    late = [1]

    async def racing(replicas: int) -> None:
        await patch(replicas)
        if replicas == 0 and late:
            env.kube._scale_to(workload, late.pop())  # the earlier scale-up lands now

    runtime._set_replicas = racing  # type: ignore[method-assign]
    await runtime.stop()
    assert workload.replicas == 0
    assert not env.kube.pods
    assert [c[0] for c in env.kube.calls].count("PATCH") == 3  # up, down, down again


async def test_another_owner_scaling_it_up_is_not_fought_in_a_busy_loop(env: Env) -> None:
    """An HPA or KEDA that keeps scaling the workload up: the stop scales to 0 once per
    pass, pausing between passes, and gives up at stop_timeout_s naming the suspects."""
    runtime = env.runtime(stop_timeout_s=0.5)
    runtime.stop_poll_s = 0.1
    await runtime.start()
    workload = env.kube.workloads["deployments", "vllm"]
    patch = runtime._set_replicas

    async def fought(replicas: int) -> None:
        await patch(replicas)
        if replicas == 0:
            env.kube._scale_to(workload, 1)  # the other owner scales it right back up

    runtime._set_replicas = fought  # type: ignore[method-assign]
    with pytest.raises(RuntimeFailure, match="no HPA or KEDA scales it"):
        await runtime.stop()
    # About one scale-down per 0.1 s pass within 0.5 s (plus the start's scale-up).
    assert [c[0] for c in env.kube.calls].count("PATCH") <= 10


async def test_a_pending_pod_is_explained_by_its_scheduling_event(env: Env) -> None:
    env.kube.unschedulable(GPU_SHORT)
    runtime = env.runtime()
    await runtime.start()

    async def explained() -> str | None:
        status = await runtime.status()
        return status.detail if GPU_SHORT in status.detail else None

    detail = await until(explained, what="the FailedScheduling message")
    assert detail.startswith("1 replica(s), 0 ready endpoint(s) in Service vllm: pod vllm-")
    assert detail.endswith(f"Pending: {GPU_SHORT}")


async def test_a_waiting_container_is_explained(env: Env) -> None:
    env.kube.container_waiting("ImagePullBackOff", 'Back-off pulling image "vllm/vllm:nope"')
    runtime = env.runtime()
    await runtime.start()

    async def explained() -> str | None:
        status = await runtime.status()
        return status.detail if "ImagePullBackOff" in status.detail else None

    detail = await until(explained, what="the waiting reason")
    assert detail.endswith(
        'container vllm ImagePullBackOff: Back-off pulling image "vllm/vllm:nope"'
    )


async def test_a_denied_patch_names_the_verb_and_resource(env: Env) -> None:
    env.kube.deny("patch", "deployments/scale")
    with pytest.raises(RuntimeFailure) as caught:
        await env.runtime().start()
    text = str(caught.value)
    assert "may not patch deployments/scale in API group 'apps' in namespace 'llm'" in text
    assert "deploy/kubernetes/rbac.yaml" in text
    assert SA_USER in text  # the API server's own words name the ServiceAccount


async def test_a_missing_workload_is_named(env: Env) -> None:
    with pytest.raises(RuntimeFailure, match="no deployments 'gone' in namespace 'llm'"):
        await env.runtime(deployment="gone").start()


async def test_a_statefulset_is_scaled_through_its_own_subresource(env: Env) -> None:
    env.kube.add_workload("statefulsets", "db", service="db-svc")
    runtime = env.runtime(deployment=None, statefulset="db", service="db-svc")
    await runtime.start()
    assert env.kube.workloads["statefulsets", "db"].replicas == 1
    assert ("PATCH", "/apis/apps/v1/namespaces/llm/statefulsets/db/scale",
            "application/merge-patch+json") in env.kube.calls  # fmt: skip


async def test_an_expired_watch_lists_again_and_keeps_up(env: Env) -> None:
    runtime = env.runtime()
    await runtime.start()
    await until(lambda: runtime.endpoints.ready == 1, what="a ready endpoint")
    assert runtime.endpoints.lists == 1
    await until(lambda: env.kube.watches == 1, what="the first watch open")
    env.kube.expire_watches()  # the open watch ends; watching from its version gets 410
    await until(lambda: env.kube.watches == 2, what="a watch open again after the relist")
    assert runtime.endpoints.lists == 2  # one relist, then watching again: no relist loop
    await runtime.stop()  # a change after the relist still arrives through the new watch
    await until(lambda: runtime.endpoints.ready == 0, what="the endpoint gone")
    assert runtime.endpoints.failures == 0  # a 410 is a relist, not a failure and a retry


async def test_a_rotated_token_is_read_again_after_a_401(env: Env) -> None:
    runtime = env.runtime()
    assert (await runtime.status()).running is False  # token-1 read and cached
    env.kube.tokens = {"token-2"}  # the API server now only takes the rotated token
    (env.tmp_path / "token").write_text("token-2")
    await runtime.start()  # a 401, a re-read, one retry
    assert env.kube.workloads["deployments", "vllm"].replicas == 1
    env.kube.tokens = {"token-3"}  # and a token nobody wrote down: a clear failure
    with pytest.raises(RuntimeFailure, match=r"refused the credentials from kubeconfig"):
        await runtime.start()


async def test_the_stand_in_refuses_other_patch_types(env: Env) -> None:
    """The real API server answers a PATCH it cannot decode with 415 (not a silent apply)."""
    async with httpx.AsyncClient(base_url=env.kube.url) as client:
        response = await client.patch(
            SCALE,
            content=b'{"spec":{"replicas":1}}',
            headers={"Authorization": "Bearer token-1", "Content-Type": "application/json"},
        )
    assert response.status_code == 415
    assert response.json()["reason"] == "UnsupportedMediaType"
    assert env.kube.workloads["deployments", "vllm"].replicas == 0


async def test_a_denied_endpointslice_list_is_the_status_detail(env: Env) -> None:
    """Readiness cannot be known without EndpointSlices: the start waits, and says why."""
    env.kube.deny("list", "endpointslices")
    runtime = env.runtime()
    await runtime.start()

    async def explained() -> str | None:
        status = await runtime.status()
        return status.detail if "may not list endpointslices" in status.detail else None

    detail = await until(explained, what="the 403 in the status detail")
    assert "in API group 'discovery.k8s.io' in namespace 'llm'" in detail
    assert (await runtime.status()).ready is False


def test_a_kubernetes_backend_is_not_counted_on_the_gateways_gpus() -> None:
    from app.settings import BackendConfig

    runtime = {"kind": "kubernetes", "namespace": "llm", "deployment": "vllm-m"}
    config = BackendConfig.model_validate(
        {"url": "http://vllm-m.llm:8000", "models": ["m"], "runtime": runtime, "lifecycle": "lazy"}
    )
    assert not config.gpus_accounted  # lazy without vram_mib: admission is the cluster's
    for placed in ({"vram_mib": 24000}, {"gpus": [1]}):
        with pytest.raises(ValueError, match="runs on the cluster's GPUs"):
            BackendConfig.model_validate(
                {"url": "http://vllm-m.llm:8000", "models": ["m"], "runtime": runtime, **placed}
            )


async def test_scale_external_never_patches_and_says_it_waits_for_the_owner(env: Env) -> None:
    runtime = env.runtime(scale="external")
    workload = env.kube.workloads["deployments", "vllm"]
    await runtime.start()  # reads the scale, starts the endpoint watch, writes nothing
    assert workload.replicas == 0
    status = await runtime.status()
    owner_wait = "waiting for its owner (KEDA/HPA) to scale deployment llm/vllm up: 0 replicas"
    assert (status.running, status.ready, status.stopped_by_owner) == (False, False, True)
    assert status.detail == owner_wait
    env.kube._scale_to(workload, 1)  # the owner (KEDA) scales it up

    async def ready() -> str | None:
        status = await runtime.status()
        return status.detail if status.ready else None

    assert await until(ready, what="a ready endpoint") == (
        "1 replica(s), 1 ready endpoint(s) in Service vllm"
    )
    assert (await runtime.status()).stopped_by_owner is False
    await runtime.stop()  # the pods are the owner's: left alone
    assert workload.replicas == 1
    assert env.kube.pods
    assert [c for c in env.kube.calls if c[0] == "PATCH"] == []
    assert runtime.describe().endswith(", scaled by its owner")


async def test_scale_external_needs_no_patch_permission(env: Env) -> None:
    """Its Role may lack `patch` on deployments/scale: nothing the runtime does needs it."""
    env.kube.deny("patch", "deployments/scale")
    runtime = env.runtime(scale="external")
    await runtime.start()
    workload = env.kube.workloads["deployments", "vllm"]
    env.kube._scale_to(workload, 1)
    assert (await runtime.status()).running
    await runtime.stop()
    assert [c for c in env.kube.calls if c[0] == "PATCH"] == []
    env.kube._scale_to(workload, 0)
    with pytest.raises(RuntimeFailure, match="may not patch"):  # scale: gateway needs it
        await env.runtime().start()
