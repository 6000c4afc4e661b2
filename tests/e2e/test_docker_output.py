"""A docker backend's output through the real Docker Engine and the project's haproxy
socket proxy: `GET /containers/{id}/logs?stdout=1&stderr=1&tail=N&follow=1` passes the
allow-list (and nothing near it does), the gateway demultiplexes Docker's frames (no TTY)
or reads raw text (TTY), follows a starting container, and shows vLLM's load phases and
a failed start's decisive line."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.fakes import docker_env
from tests.fakes.processes import free_port, gateway_process
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

MakeContainer = Callable[..., str]
TIMEOUT = httpx.Timeout(30.0, connect=5.0)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def config(docker_url: str, container: str, port: int) -> dict[str, Any]:
    return {
        "docker": {"url": docker_url, "timeout_s": 5},
        "health_interval_s": 0.5,
        "backends": {
            "llm": {
                "url": f"http://127.0.0.1:{port}",
                "models": ["m"],
                "runtime": {"kind": "docker", "container": container, "stop_timeout_s": 5},
                "lifecycle": "lazy",
                "vram_mib": 1000,
                "start_timeout_s": 30,
            }
        },
    }


def test_the_proxy_allows_exactly_the_logs_query(
    docker_proxy: docker_env.DockerProxy,
    docker_engine: docker_env.DockerEngine,
    make_fake_vllm_container: MakeContainer,
) -> None:
    name = make_fake_vllm_container(unique("ms-test-logs-acl"), free_port(), startup_delay=0)
    v = f"/v{docker_engine.api_version}"
    with httpx.Client(base_url=docker_proxy.url, timeout=TIMEOUT) as proxy:
        for query in ("stdout=1&stderr=1&tail=10", "stdout=1&stderr=1&tail=0&follow=1"):
            response = proxy.get(f"{v}/containers/{name}/logs?{query}")
            assert response.status_code == 200, (query, response.text)
        for query in (
            "stdout=1",
            "stdout=1&stderr=1&tail=all",
            "stdout=1&stderr=1&tail=10&follow=1&since=0",
            "stdout=1&stderr=1&tail=10&timestamps=1",
            "follow=1&stdout=1&stderr=1&tail=10",
        ):
            response = proxy.get(f"{v}/containers/{name}/logs?{query}")
            assert response.status_code == 403, query
        # The path rules still hold: another container action under a logs-like query.
        assert proxy.post(f"{v}/containers/{name}/logs?stdout=1&stderr=1&tail=1").status_code == 403
        assert (
            proxy.get(f"{v}/containers/{name}/attach?stdout=1&stderr=1&tail=1").status_code == 403
        )


@pytest.mark.parametrize("tty", [False, True], ids=["multiplexed", "tty"])
def test_logs_and_load_progress_of_a_container(
    tty: bool,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port = free_port()
    container = make_fake_vllm_container(
        unique("ms-test-logs"), port, startup_delay=3.0, model="m", tty=tty,
        extra_args=("--print-startup-log",),
    )  # fmt: skip
    with gateway_process(config(docker_proxy.url, container, port)) as gw:
        starter = threading.Thread(
            target=lambda: httpx.post(f"{gw.url}/backends/llm/start", timeout=TIMEOUT)
        )
        starter.start()
        until_sync(lambda: backend(gw)["state"] == "starting", timeout_s=10)
        chunks: list[str] = []

        def follow() -> None:
            url = f"{gw.url}/backends/llm/logs?follow=1&tail=100"
            with httpx.stream("GET", url, timeout=TIMEOUT) as stream:
                assert stream.status_code == 200, stream.read()
                chunks.extend(stream.iter_text())

        reader = threading.Thread(target=follow)
        reader.start()
        phases: list[str] = []
        while (state := backend(gw))["state"] == "starting":
            if state["load"] is not None:
                phases.append(state["load"]["phase"])
            time.sleep(0.05)
        starter.join(30)
        assert backend(gw)["state"] == "ready"
        # Docker's log driver passes a line on at its "\n": the shard bars (one line each)
        # move the phase; the CUDA-graph bar ("\r" only) comes whole at its end.
        seen = list(dict.fromkeys(phases))
        assert "loading_weights" in seen, seen
        assert seen.index("loading_weights") > 0, seen
        # Lines arrived through the follow while it still started.
        assert any("Starting to load model m..." in c for c in chunks)
        httpx.post(f"{gw.url}/backends/llm/stop", timeout=TIMEOUT)
        reader.join(15)
        assert not reader.is_alive()  # the container stopped: the followed output ended
        text = "".join(chunks)
        # Demultiplexed (no 8-byte headers left) or raw TTY text: vLLM's lines, whole.
        assert "\x01\x00\x00\x00" not in text
        assert "\x02\x00\x00\x00" not in text
        assert "GPU KV cache size: 76,096 tokens" in text
        assert "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|" in text
        tail = httpx.get(f"{gw.url}/backends/llm/logs?tail=3", timeout=TIMEOUT)
        assert tail.status_code == 200
        assert len(tail.text.splitlines()) == 3
        assert "shutting down" in tail.text
        print(f"--- tty={tty}: GET /backends/llm/logs?tail=3\n{tail.text!r}")


def test_a_container_failing_its_kv_cache_check_is_explained(
    docker_proxy: docker_env.DockerProxy, make_fake_vllm_container: MakeContainer
) -> None:
    port = free_port()
    container = make_fake_vllm_container(
        unique("ms-test-logs-kv"), port, startup_delay=1.0, model="m",
        extra_args=("--fail-kv-cache", "--max-model-len", "32768"),
    )  # fmt: skip
    with gateway_process(config(docker_proxy.url, container, port)) as gw:
        response = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=TIMEOUT,
        )
        assert response.status_code == 503
        message = response.json()["error"]["message"]
        assert "exited with code 1 before it was ready" in message
        assert "To serve at least one request with the model's max seq len (32768)" in message
        assert "microscheduler plan context" in message
        assert "(its output: `microscheduler logs llm`)" in message
        assert message in backend(gw)["reason"] or backend(gw)["reason"] in message


def backend(gw: Any) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{gw.url}/status", timeout=TIMEOUT).json()["backends"][0]
    return found
