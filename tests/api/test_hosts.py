"""`hosts:` through the gateway: the local machine and `node-c`, each with its own simulated
32 GiB GPU, fake vLLM servers on real ports. Admission, eviction, zones, the yield and
/status are per host: what runs on one host's GPU never counts against the other's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.api.test_lifecycle_api import backend_state, lazy, lifecycle_gateway
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime

NODE_C = {"node-c": {"docker": {"url": "http://node-c:2375"}, "gpu": {"probe": "sim"}}}


def on_node_c(port: int, **fields: Any) -> dict[str, Any]:
    return lazy(
        port,
        host="node-c",
        runtime={"kind": "docker", "container": "vllm-c"},
        **fields,
    )


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def test_each_host_admits_on_its_own_gpu(tmp_path: Path) -> None:
    port_a, port_c = free_port(), free_port()
    runtimes = {
        "a": FakeVllmRuntime(port_a, models=["model-a"]),
        "c": FakeVllmRuntime(port_c, models=["model-c"]),
    }
    backends = {  # 20000 + 20000 MiB would not fit on one simulated 32768 MiB GPU
        "a": lazy(port_a, models=["model-a"], vram_mib=20000),
        "c": on_node_c(port_c, models=["model-c"], vram_mib=20000),
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=NODE_C) as gw:
        for model in ("model-a", "model-c"):
            answer = await gw.client.post("/v1/chat/completions", json=chat(model))
            assert answer.status_code == 200, answer.text
        assert (await backend_state(gw, "a"))["state"] == "ready"
        assert (await backend_state(gw, "c"))["state"] == "ready"  # not evicted for a
        assert (await backend_state(gw, "c"))["host"] == "node-c"

        status = (await gw.client.get("/status")).json()
        hosts = {h["name"]: h for h in status["hosts"]}
        assert list(hosts) == ["local", "node-c"]
        assert hosts["local"]["holds"]["placed_mib"] == {"0": 20000}
        assert hosts["node-c"]["holds"]["placed_mib"] == {"0": 20000}
        assert hosts["node-c"]["backends"] == ["c"]
        assert hosts["node-c"]["gpu"]["gpus"][0]["total_mib"] == 32768

        # A zone on node-c evicts node-c's backend only, and names the host.
        acquired = await gw.client.post(
            "/vram/zones/img/acquire", json={"mib": 30000, "holder": "comfyui", "host": "node-c"}
        )
        assert acquired.status_code == 200, acquired.text
        assert acquired.json()["stopped"] == ["c"]
        assert acquired.json()["host"] == "node-c"
        assert (await backend_state(gw, "a"))["state"] == "ready"
        refused = await gw.client.post("/v1/chat/completions", json=chat("model-c"))
        assert refused.status_code == 503
        assert "on node-c GPU 0" in refused.json()["error"]["message"]

        # Zone names are unique across hosts; a release finds the zone's host.
        clash = await gw.client.post("/vram/zones/img/acquire", json={"mib": 1000, "holder": "x"})
        assert clash.status_code == 409
        assert "node-c" in clash.json()["error"]["message"]
        released = await gw.client.post("/vram/zones/img/release")
        assert released.status_code == 200
        assert released.json()["unblocked"] == ["c"]

        unknown = await gw.client.post("/vram/yield", json={"host": "node-x"})
        assert unknown.status_code == 400
        assert "node-x" in unknown.json()["error"]["message"]

        yielded = await gw.client.post("/vram/yield", json={"host": "node-c"})
        assert yielded.status_code == 200, yielded.text
        assert yielded.json()["host"] == "node-c"
        assert (await backend_state(gw, "a"))["state"] == "ready"  # the local host's
        assert (await gw.client.get("/vram/yield")).json()["state"] == "none"
        assert (await gw.client.get("/vram/yield?host=node-c")).json()["state"] == "yielded"
        restored = await gw.client.post("/vram/restore", json={"host": "node-c"})
        assert restored.json()["restored"] is True
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_vram_yields_total{host="node-c",outcome="yielded"} 1.0' in metrics
        assert 'microscheduler_gpu_probe_up{host="node-c"} 1.0' in metrics
