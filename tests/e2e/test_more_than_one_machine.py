"""More than one machine, end to end: the gateway as a real process, the stand-in
Kubernetes API server and Prometheus (tests/fakes/kube_api.py, tests/fakes/prometheus.py,
written from their API references) on an event loop of their own thread, fake vLLM
processes, and the official `openai` SDK:

- a lazy backend on a Kubernetes Deployment at 0 replicas: the request is held while the
  gateway scales it up and waits for a ready endpoint, then answered;
- the GPUs of another host read from Prometheus (dcgm-exporter's series) in /status;
- 20 concurrent streams over a replica group of two fake vLLM processes: each gets 8-12;
- `hosts:` a kubernetes backend with `host: node-c` is admitted on node-c's GPU as
  Prometheus reports it: refused while the GPU is full (the error names node-c), started
  once the memory is free.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.kube_api import FakeKube, fake_kube, write_kubeconfig
from tests.fakes.processes import GatewayProcess, fake_vllm_process, gateway_process
from tests.fakes.prometheus import FakePrometheus, dcgm_gpu, fake_prometheus
from tests.fakes.threaded import LoopThread
from tests.fakes.waits import until_sync

T = TypeVar("T")
Models = dict[str, Any]  # a models.yaml
HI = [{"role": "user", "content": "hi"}]


@dataclass
class StandIns:
    """The stand-in Kubernetes API and Prometheus, served from a thread's own loop (the
    test's thread blocks on the gateway process and the SDK)."""

    loop: LoopThread
    kube: FakeKube
    prometheus: FakePrometheus


@pytest.fixture
def stand_ins() -> Iterator[StandIns]:
    loop = LoopThread()
    try:
        kube = loop.enter(fake_kube(ready_after_s=1.0))
        series = dcgm_gpu(0, host="node-c", used_mib=2048, free_mib=79000)
        yield StandIns(loop, kube, loop.enter(fake_prometheus(*series)))
    finally:
        loop.close()


def config(tmp: Path, stand_ins: StandIns, pod: str, replicas: tuple[str, str]) -> Models:
    kubeconfig = write_kubeconfig(tmp, stand_ins.kube.url)
    member = {"models": ["pool-model"], "replica_of": "pool", "runtime": {"kind": "external"}}
    models = {
        "kubernetes": {"kubeconfig": str(kubeconfig)},
        "gpu": {"probe": "prometheus", "poll_interval_s": 0.5,
                "prometheus": {"url": stand_ins.prometheus.url,
                               "selector": '{Hostname="node-c"}', "query_interval_s": 0}},
        "backends": {
            "cluster": {"url": pod, "models": ["cluster-model"], "lifecycle": "lazy",
                        "runtime": {"kind": "kubernetes", "namespace": "llm",
                                    "deployment": "vllm-cluster"}},
            "r1": {"url": replicas[0], **member},
            "r2": {"url": replicas[1], **member},
        },
    }  # fmt: skip
    return models


def sdk_of(gw: GatewayProcess) -> openai.OpenAI:
    """A client of the gateway (closed by its `with`, before the gateway stops)."""
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.mark.e2e
def test_a_cluster_backend_a_remote_gpu_and_a_replica_group(
    stand_ins: StandIns, tmp_path: Path
) -> None:
    workload = stand_ins.loop.run(_add_workload(stand_ins.kube))
    slow = ("--tokens-per-second", "20", "--max-tokens", "20")  # a stream lasts about 1 s
    with (
        fake_vllm_process("cluster-model") as pod,
        fake_vllm_process("pool-model", *slow) as r1,
        fake_vllm_process("pool-model", *slow) as r2,
        gateway_process(config(tmp_path, stand_ins, pod, (r1, r2))) as gw,
        sdk_of(gw) as sdk,
    ):
        # The Deployment is at 0: the request is held through the scale-up and the wait
        # for a ready endpoint (the stand-in makes it ready 1 s after the pod appears).
        assert workload.replicas == 0
        answer = sdk.chat.completions.create(model="cluster-model", messages=HI)  # type: ignore[arg-type]
        assert answer.choices[0].message.content
        assert workload.replicas == 1
        assert any(call[0] == "PATCH" for call in stand_ins.kube.calls)

        status = httpx.get(gw.url + "/status", timeout=10).json()
        gpu = status["gpu"]
        assert gpu["source"] == "prometheus"
        assert gpu["up"] is True
        (remote,) = gpu["gpus"]
        assert remote["name"] == "NVIDIA A100-SXM4-80GB"
        assert remote["total_mib"] == 2048 + 79000 + 486  # used + free + reserved

        def stream(_: int) -> int:
            chunks = sdk.chat.completions.create(model="pool-model", messages=HI, stream=True)  # type: ignore[arg-type]
            return sum(1 for _ in chunks)

        with ThreadPoolExecutor(20) as pool:
            counts = list(pool.map(stream, range(20)))
        assert all(n > 0 for n in counts)
        metrics = httpx.get(gw.url + "/metrics", timeout=10).text
    served = _served_by(metrics, "pool-model")
    print(f"streams per replica: {served}")
    assert sum(served.values()) == 20
    assert 8 <= served.get("r1", 0) <= 12, served
    assert 8 <= served.get("r2", 0) <= 12, served


def hosts_config(tmp: Path, stand_ins: StandIns, pod: str) -> Models:
    kubeconfig = write_kubeconfig(tmp, stand_ins.kube.url)
    models = {
        "kubernetes": {"kubeconfig": str(kubeconfig)},
        "gpu": {"probe": "sim"},  # the gateway's own machine
        "hosts": {
            "node-c": {"gpu": {"probe": "prometheus", "poll_interval_s": 0.5,
                               "reclaim_timeout_s": 2,
                               "prometheus": {"url": stand_ins.prometheus.url,
                                              "selector": '{Hostname="node-c"}',
                                              "query_interval_s": 0}}},
        },
        "backends": {
            "cluster": {"url": pod, "models": ["cluster-model"], "lifecycle": "lazy",
                        "host": "node-c", "vram_mib": 60000,
                        "runtime": {"kind": "kubernetes", "namespace": "llm",
                                    "deployment": "vllm-cluster"}},
        },
    }  # fmt: skip
    return models


@pytest.mark.e2e
def test_a_cluster_backend_with_a_host_is_admitted_on_that_hosts_gpu(
    stand_ins: StandIns, tmp_path: Path
) -> None:
    workload = stand_ins.loop.run(_add_workload(stand_ins.kube))
    stand_ins.prometheus.series = dcgm_gpu(0, host="node-c", used_mib=30000, free_mib=51048)
    with (
        fake_vllm_process("cluster-model") as pod,
        gateway_process(hosts_config(tmp_path, stand_ins, pod)) as gw,
        sdk_of(gw) as sdk,
    ):
        # 30000 of node-c's 81534 MiB are used by something else (plus the 486 the driver
        # reserves, counted as used as NVML does): 60000 do not fit.
        with pytest.raises(openai.APIStatusError) as refused:
            sdk.chat.completions.create(model="cluster-model", messages=HI)  # type: ignore[arg-type]
        assert refused.value.status_code == 503
        message = str(refused.value)
        assert "needs 60000 MiB on node-c GPU 0" in message, message
        assert "node-c GPU 0: 30486 of 81534 MiB in use: other processes 30486 MiB" in message, (
            message
        )
        assert workload.replicas == 0  # refused before anything was scaled
        assert not any(call[0] == "PATCH" for call in stand_ins.kube.calls)

        # The other workload is gone: once Prometheus says so, the start is admitted.
        stand_ins.prometheus.series = dcgm_gpu(0, host="node-c", used_mib=2048, free_mib=79000)
        until_sync(
            lambda: _used_mib(gw.url, "node-c") == 2048 + 486,
            what="node-c GPU 0 to show 2534 MiB used",
        )
        answer = sdk.chat.completions.create(model="cluster-model", messages=HI)  # type: ignore[arg-type]
        assert answer.choices[0].message.content
        assert workload.replicas == 1

        status = httpx.get(gw.url + "/status", timeout=10).json()
        hosts = {host["name"]: host for host in status["hosts"]}
        assert hosts["node-c"]["probe"] == "prometheus"
        assert hosts["node-c"]["holds"]["placed_mib"] == {"0": 60000}
        assert hosts["node-c"]["backends"] == ["cluster"]
        assert hosts["local"]["holds"]["placed_mib"] == {}
        (cluster,) = status["backends"]
        assert cluster["host"] == "node-c"
        metrics = httpx.get(gw.url + "/metrics", timeout=10).text
        assert 'microscheduler_gpu_probe_up{host="node-c"} 1.0' in metrics
        assert (
            'microscheduler_gpu_memory_used_bytes{UUID="GPU-node-c-0000",gpu="0",host="node-c"'
            in metrics
        )


def _used_mib(url: str, host: str) -> int | None:
    """GPU 0's used MiB on `host`, as /status shows it."""
    status = httpx.get(url + "/status", timeout=10).json()
    gpus = next(h["gpu"]["gpus"] for h in status["hosts"] if h["name"] == host)
    return gpus[0]["used_mib"] if gpus else None


async def _add_workload(kube: FakeKube) -> Any:
    return kube.add_workload("deployments", "vllm-cluster")


def _served_by(metrics: str, model: str) -> dict[str, int]:
    served: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name != "microscheduler_requests":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("model") == model:
                backend = sample.labels["backend"]
                served[backend] = served.get(backend, 0) + int(sample.value)
    return served
