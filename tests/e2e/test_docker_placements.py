"""A Docker backend with `placements:` against the real Docker Engine (through the
project's socket proxy): on a simulated box of two 24 GiB GPUs, the gateway places the
backend on the GPU with room and starts that placement's container (and not the other);
restarted, it finds that container running and adopts the backend there, on its GPU. A
placement's container started by hand keeps the gateway from starting another (they share
the port): the start is refused, naming it.

The containers are the fake-vLLM image's (tests/fakes/docker_env.py), both created on the
backend's one port (only one runs at a time); GPU 0 is taken by a pinned process backend
counted at 20000 MiB, so a 10000 MiB start fits on GPU 1 only.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.test_docker_lifecycle import (
    HTTP_TIMEOUT,
    STARTUP_DELAY_S,
    MakeContainer,
    backend_info,
    chat,
    chat_error,
    debug,
    error_body,
    gateway_config,
    running_gateway,
    start_events,
    state,
    unique,
)
from tests.fakes import docker_env
from tests.fakes.processes import GatewayProcess, free_port
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

TWO_GPUS = {"probe": "sim", "poll_interval_s": 0.5, "sim": {"total_mib": 24576, "count": 2}}


def used_mib(gw: GatewayProcess) -> list[int]:
    """Each simulated GPU's used memory (what the gateway placed there: no ledger)."""
    response = httpx.get(gw.url + "/status", timeout=HTTP_TIMEOUT)
    assert response.status_code == 200, response.text
    return [gpu["used_mib"] for gpu in response.json()["gpu"]["gpus"]]


def ready(gw: GatewayProcess, name: str) -> None:
    def is_ready() -> bool:
        """the backend is ready"""
        return bool(backend_info(gw, name)["state"] == "ready")

    until_sync(is_ready, timeout_s=30)


def two_gpu_config(proxy_url: str, port: int, gpu0: str, gpu1: str) -> dict[str, Any]:
    """GPU 0 taken by a pinned process backend (20000 MiB), and `placed` (10000 MiB,
    `gpus: auto`) with a placement's container on each GPU, both on 127.0.0.1:`port`."""
    filler_port = free_port()
    filler = ["{python}", "-m", "app.sim.vllm", "--port", str(filler_port), "--model",
              "filler-model", "--startup-delay", "0"]  # fmt: skip
    backends: dict[str, Any] = {
        "filler": {  # GPU 0: 20000 of its 24576 MiB
            "url": f"http://127.0.0.1:{filler_port}",
            "models": ["filler-model"],
            "gpus": [0],
            "vram_mib": 20000,
            "priority": 90,
            "runtime": {
                "kind": "process",
                "command": filler,
            },
        },
        "placed": {
            "url": f"http://127.0.0.1:{port}",
            "models": ["placed-model"],
            "gpus": "auto",
            "vram_mib": 10000,
            "lifecycle": "lazy",
            "start_timeout_s": 30,
            "max_wait_s": 30,
            "runtime": {
                "kind": "docker",
                "stop_timeout_s": 5,
                "placements": [
                    {"gpus": [0], "container": gpu0},
                    {"gpus": [1], "container": gpu1},
                ],
            },
        },
    }
    return gateway_config(proxy_url, backends, gpu=TWO_GPUS)


def test_the_placement_with_room_is_started_and_adopted_there_after_a_restart(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port, name = free_port(), unique("ms-test-placed")
    gpu0, gpu1 = f"{name}-gpu0", f"{name}-gpu1"
    for container in (gpu0, gpu1):
        make_fake_vllm_container(
            container, port, model="placed-model", startup_delay=STARTUP_DELAY_S
        )
    config = two_gpu_config(docker_proxy.url, port, gpu0, gpu1)

    with running_gateway(config) as gw:
        ready(gw, "filler")
        reply = chat(gw, "placed-model")

        assert reply.model == "placed-model"
        assert state(docker_engine, gpu1)["Status"] == "running", debug(gw, docker_engine, gpu1)
        assert state(docker_engine, gpu0)["Status"] == "created"
        assert backend_info(gw, "placed")["state"] == "ready"
        assert used_mib(gw) == [20000, 10000]
    # The gateway is gone; its container is not (containers outlive it).
    assert state(docker_engine, gpu1)["Status"] == "running"
    started = start_events(docker_engine, gpu1, since=0)

    with running_gateway(config) as gw:
        ready(gw, "placed")  # adopted: found running, not started

        info = backend_info(gw, "placed")
        assert info["runtime_detail"] == f"{gpu1}: running", info
        ready(gw, "filler")
        assert used_mib(gw) == [20000, 10000], debug(gw)  # counted on GPU 1, where it runs
        assert state(docker_engine, gpu0)["Status"] == "created"
        assert chat(gw, "placed-model").model == "placed-model"
        assert start_events(docker_engine, gpu1, since=0) == started  # not started again


def test_a_start_is_refused_while_another_placement_runs_started_by_hand(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port, name = free_port(), unique("ms-test-placed")
    gpu0, gpu1 = f"{name}-gpu0", f"{name}-gpu1"
    for container in (gpu0, gpu1):
        make_fake_vllm_container(
            container, port, model="placed-model", startup_delay=STARTUP_DELAY_S
        )
    with running_gateway(two_gpu_config(docker_proxy.url, port, gpu0, gpu1)) as gw:
        ready(gw, "filler")
        with docker_engine.client() as engine:  # by hand, behind the gateway's back
            assert engine.post(f"/containers/{gpu0}/start").status_code == 204

        refused = chat_error(gw, "placed-model")  # admission chose GPU 1: room there

        assert refused.status_code == 503, refused.body
        message = error_body(refused)["message"]
        assert f"cannot start container '{gpu1}' of backend placed: container '{gpu0}' " in message
        assert "(backends.placed.runtime.placements[0].container, GPU 0) is running" in message
        assert f"docker stop {gpu0}" in message
        assert state(docker_engine, gpu1)["Status"] == "created"  # never two at once
        assert state(docker_engine, gpu0)["Status"] == "running"
