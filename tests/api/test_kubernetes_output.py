"""A kubernetes backend's output through the stand-in API server: the newest pod's log
(`pods/{pod}/log`, text/plain, chunked while following) gives vLLM's load phases while
the backend starts, `GET /backends/{name}/logs` (tail and follow), and a Role without
`get` on `pods/log` is named in the error."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.api.test_kubernetes_backend import kube_gateway
from tests.fakes.servers import chat, until_backend
from tests.fakes.waits import until

PREFIX = "(EngineCore_DP0 pid=1) INFO 11-26 07:50:01"
STARTUP = (
    f"{PREFIX} [gpu_model_runner.py:4979] Starting to load model m...\n"
    "\rLoading safetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01,  1.9it/s]\n"
)


async def test_a_pods_log_shows_the_load_and_is_served_tailed_and_followed(
    tmp_path: Path,
) -> None:
    async with kube_gateway(tmp_path, ready_after_s=None) as (gw, kube):
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("m")))
        await until(lambda: kube.pods, what="the pod")
        kube.start_containers()
        kube.write_log(STARTUP)

        async def load() -> dict[str, object] | None:
            backend = (await gw.client.get("/status")).json()["backends"][0]
            found: dict[str, object] | None = backend["load"]
            return found if found and found["phase"] == "loading_weights" else None

        seen = await until(load, what="the phase from the pod's log")
        assert seen["percent"] == 40  # 10 + 50% of the 10..70 span of the weight shards
        kube.make_ready()
        assert (await request).status_code == 200
        tail = await gw.client.get("/backends/m/logs", params={"tail": "1"})
        assert tail.status_code == 200
        assert tail.headers["content-type"].startswith("text/plain")
        assert tail.text == "Loading safetensors checkpoint shards:  50% Completed | 2/4 " \
            "[00:01<00:01,  1.9it/s]\n"  # fmt: skip
        assert ("GET", f"/api/v1/namespaces/llm/pods/{next(iter(kube.pods))}/log", "") in [
            (m, p, "") for m, p, _ in kube.calls
        ]
        # Followed (the in-process client reads the whole body): a line written meanwhile
        # comes, and the stream ends when the pod goes.
        follow = asyncio.create_task(
            gw.client.get("/backends/m/logs", params={"tail": "0", "follow": "1"})
        )
        await asyncio.sleep(0.2)
        kube.write_log(f"{PREFIX} [entry.py:139] Starting vLLM server on http://0.0.0.0:8000\n")
        await gw.client.post("/backends/m/stop")
        followed = await asyncio.wait_for(follow, 10)
        assert followed.status_code == 200
        assert followed.text == (
            f"{PREFIX} [entry.py:139] Starting vLLM server on http://0.0.0.0:8000\n"
        )


async def test_a_role_without_pods_log_is_named(tmp_path: Path) -> None:
    async with kube_gateway(tmp_path, ready_after_s=0.1) as (gw, kube):
        kube.deny("get", "pods/log")
        assert (await gw.client.post("/backends/m/start")).status_code == 200
        await until_backend(gw, "m", state="ready")
        response = await gw.client.get("/backends/m/logs")
        assert response.status_code == 503
        message = response.json()["error"]["message"]
        assert "may not get pods/log" in message
        assert "deploy/kubernetes/rbac.yaml" in message
