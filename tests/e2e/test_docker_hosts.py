"""`hosts:` with a real Docker Engine: the gateway process reaches the local machine's
containers through one socket proxy and node-c's through another (two haproxy instances
of the project's proxy config; both in front of this machine's engine, as no second
machine is here), each host with its own simulated GPU. Checked in the engine and in each
proxy's own request log: node-c's containers are started and stopped through node-c's
proxy only, eviction stays on its host, and a dead node-c proxy degrades node-c alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.test_docker_lifecycle import (
    HTTP_TIMEOUT,
    MakeContainer,
    chat,
    chat_error,
    docker_backend,
    gateway_config,
    running_gateway,
    state,
    unique,
)
from tests.fakes import docker_env
from tests.fakes.processes import free_port

pytestmark = pytest.mark.e2e

SIM_GPU = {"probe": "sim", "sim": {"total_mib": 20000}}


@pytest.fixture
def node_c_proxy(docker_engine: docker_env.DockerEngine) -> Iterator[docker_env.DockerProxy]:
    """node-c's socket proxy: a second haproxy with the project's config."""
    with docker_env.docker_proxy(docker_engine.socket) as proxy:
        yield proxy


def starts_through(proxy: docker_env.DockerProxy, container: str) -> int:
    """How many container starts of `container` went through `proxy` (its request log)."""
    return sum(f"/containers/{container}/start" in line for line in proxy.log().splitlines())


def test_each_hosts_containers_go_through_its_own_proxy_and_evict_on_their_host(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    node_c_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    ports = {key: free_port() for key in ("a", "c1", "c2")}
    names = {key: unique(f"ms-host-{key}") for key in ports}
    for key, port in ports.items():
        make_fake_vllm_container(names[key], port, model=f"{key}-model", startup_delay=0.5)
    backends = {  # 12000 + 12000 MiB do not fit one simulated 20000 MiB GPU
        "a": docker_backend(names["a"], ports["a"], "a-model", vram_mib=12000),
        "c1": docker_backend(names["c1"], ports["c1"], "c1-model", vram_mib=12000,
                             host="node-c", priority=10),
        "c2": docker_backend(names["c2"], ports["c2"], "c2-model", vram_mib=12000,
                             host="node-c", priority=60),
    }  # fmt: skip
    hosts = {"node-c": {"docker": {"url": node_c_proxy.url, "timeout_s": 5}, "gpu": SIM_GPU}}
    config = gateway_config(docker_proxy.url, backends, gpu=SIM_GPU, hosts=hosts)
    with running_gateway(config) as gw:
        assert chat(gw, "a-model").choices[0].message.content
        assert chat(gw, "c1-model").choices[0].message.content
        # Two hosts, two GPUs: c1 did not evict a.
        assert state(docker_engine, names["a"])["Status"] == "running"
        assert state(docker_engine, names["c1"])["Status"] == "running"
        assert starts_through(docker_proxy, names["a"]) == 1
        assert starts_through(node_c_proxy, names["a"]) == 0
        assert starts_through(node_c_proxy, names["c1"]) == 1
        assert starts_through(docker_proxy, names["c1"]) == 0

        # c2 (higher priority) evicts c1 on node-c, never a on the local host.
        assert chat(gw, "c2-model").choices[0].message.content
        assert state(docker_engine, names["c1"])["Status"] == "exited"
        assert state(docker_engine, names["a"])["Status"] == "running"
        assert f"/containers/{names['c1']}/stop" in node_c_proxy.log()
        assert f"/containers/{names['c1']}/stop" not in docker_proxy.log()

        # A request for c1 now is refused on node-c's GPU, naming it.
        refused = chat_error(gw, "c1-model")
        assert refused.code == "backend_no_vram", refused.body
        assert "needs 12000 MiB on node-c GPU 0" in str(refused.body), refused.body

        # c2 stopped, then node-c's proxy goes away: node-c's backends cannot start (the
        # error names its key), the local host's keep serving.
        stopped = httpx.post(gw.url + "/backends/c2/stop", timeout=HTTP_TIMEOUT)
        assert stopped.status_code == 200, stopped.text
        node_c_proxy.stop()
        failed = chat_error(gw, "c1-model")
        assert failed.status_code == 503, failed.body
        assert "hosts.node-c.docker.url" in str(failed.body), failed.body
        assert chat(gw, "a-model").choices[0].message.content

        status = httpx.get(gw.url + "/status", timeout=HTTP_TIMEOUT).json()
        placed = {h["name"]: h["holds"]["placed_mib"] for h in status["hosts"]}
        assert placed == {"local": {"0": 12000}, "node-c": {}}, placed
