"""A kubernetes backend with `host: node-c` is admitted on node-c's GPU like a docker one
(its start evicts node-c's lazy backends, a pinned one refuses it naming node-c); without
`host:` the cluster's scheduler places it and the gateway admits nothing. The stand-in API
server scales the workload; the fake vLLM answers behind the "Service"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from app.runtimes.base import Runtime
from app.runtimes.kube_api import KubeApi
from app.runtimes.kubernetes import KubernetesRuntime
from app.services import Seams
from app.settings import BackendConfig, KubernetesConfig, KubernetesRuntimeConfig
from tests.api.test_hosts import NODE_C, on_node_c
from tests.api.test_lifecycle_api import backend_state, pinned
from tests.fakes.kube_api import FakeKube, fake_kube, write_kubeconfig
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, Gateway, chat, fake_vllm, gateway, gateway_settings


@asynccontextmanager
async def mixed_gateway(
    tmp_path: Path,
    others: dict[str, dict[str, Any]],
    runtimes: dict[str, FakeVllmRuntime],
    **kube_fields: Any,
) -> AsyncIterator[tuple[Gateway, FakeKube]]:
    """Kubernetes backend `k` (lazy, model `k`) beside `others`, run by `runtimes`."""
    async with fake_kube(ready_after_s=0.0) as kube, fake_vllm(models=["k"]) as vllm:
        kube.add_workload("deployments", "vllm-k")
        kubeconfig = write_kubeconfig(tmp_path, kube.url)
        api = KubeApi(KubernetesConfig(kubeconfig=kubeconfig))
        k = {
            "url": vllm.url,
            "models": ["k"],
            "runtime": {"kind": "kubernetes", "namespace": "llm", "deployment": "vllm-k"},
            "lifecycle": "lazy",
            **kube_fields,
        }

        def runtime_for(name: str, config: BackendConfig) -> Runtime:
            if isinstance(config.runtime, KubernetesRuntimeConfig):
                return KubernetesRuntime(name, config.runtime, api)
            return runtimes[name]

        settings = gateway_settings(
            {"k": k, **others},
            state_dir=tmp_path / "var",
            hosts=NODE_C,
            kubernetes={"kubeconfig": kubeconfig},
        )
        try:
            async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
                yield gw, kube
        finally:
            await api.aclose()


def replicas(kube: FakeKube) -> int:
    return kube.workloads["deployments", "vllm-k"].replicas


async def test_its_start_evicts_a_lazy_docker_backend_on_node_c(tmp_path: Path) -> None:
    port = free_port()
    runtimes = {"c": FakeVllmRuntime(port, models=["model-c"])}
    others = {"c": on_node_c(port, models=["model-c"], vram_mib=20000, priority=10)}
    async with mixed_gateway(
        tmp_path, others, runtimes, host="node-c", vram_mib=20000, priority=50
    ) as (gw, kube):
        assert (await gw.client.post("/v1/chat/completions", json=chat("model-c"))).is_success
        answer = await gw.client.post("/v1/chat/completions", json=chat("k"))
        assert answer.status_code == 200, answer.text
        assert replicas(kube) == 1
        assert runtimes["c"].stops == 1
        assert (await backend_state(gw, "c"))["state"] == "stopped"
        view = await backend_state(gw, "k")
        assert (view["state"], view["host"]) == ("ready", "node-c")
        hosts = {h["name"]: h for h in (await gw.client.get("/status")).json()["hosts"]}
        assert hosts["node-c"]["holds"]["placed_mib"] == {"0": 20000}
        assert sorted(hosts["node-c"]["backends"]) == ["c", "k"]
        assert hosts["local"]["holds"]["placed_mib"] == {}


async def test_a_pinned_backend_on_node_c_refuses_it_naming_node_c(tmp_path: Path) -> None:
    port = free_port()
    runtimes = {"pc": FakeVllmRuntime(port, models=["model-pc"])}
    others = {
        "pc": pinned(
            port,
            models=["model-pc"],
            host="node-c",
            runtime={"kind": "docker", "container": "vllm-pc"},
        )
    }
    async with mixed_gateway(tmp_path, others, runtimes, host="node-c", vram_mib=20000) as (
        gw,
        kube,
    ):
        await gw.client.post("/backends/pc/start")
        assert (await backend_state(gw, "pc"))["state"] == "ready"
        refused = await gw.client.post("/v1/chat/completions", json=chat("k"))
        assert refused.status_code == 503
        message = refused.json()["error"]["message"]
        assert "needs 20000 MiB on node-c GPU 0" in message
        assert "backend pc 16000 MiB (pinned)" in message
        assert replicas(kube) == 0
        assert not [c for c in kube.calls if c[0] == "PATCH"]  # never scaled up
        assert runtimes["pc"].stops == 0


async def test_without_a_host_it_starts_without_admission(tmp_path: Path) -> None:
    port = free_port()
    runtimes = {"p": FakeVllmRuntime(port, models=["model-p"])}
    # The local GPU is almost full: a local backend of any size would not fit beside it.
    others = {"p": pinned(port, models=["model-p"], vram_mib=32000)}
    async with mixed_gateway(tmp_path, others, runtimes) as (gw, kube):
        await gw.client.post("/backends/p/start")
        assert (await backend_state(gw, "p"))["state"] == "ready"
        answer = await gw.client.post("/v1/chat/completions", json=chat("k"))
        assert answer.status_code == 200, answer.text
        assert replicas(kube) == 1
        assert runtimes["p"].stops == 0
        view = await backend_state(gw, "k")
        assert view["state"] == "ready"
        assert view["host"] is None
        hosts = {h["name"]: h for h in (await gw.client.get("/status")).json()["hosts"]}
        assert hosts["local"]["holds"]["placed_mib"] == {"0": 32000}
        assert hosts["node-c"]["holds"]["placed_mib"] == {}
        assert all("k" not in h["backends"] for h in hosts.values())
