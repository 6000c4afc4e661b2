"""The Docker lifecycle end to end: `microscheduler serve` (uvicorn) starting and stopping
fake-vLLM containers of a real Docker Engine through the project's haproxy socket proxy,
driven by the official `openai` SDK (and httpx where the raw bytes matter).

Each test makes its own uniquely named containers (created, not started) and its own
gateway; what it asserts is read back from the engine (inspect, events), from the
gateway's `/backends` and `/metrics`, and from what the client received.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from app.lifecycle.state import RESTART_BACKOFF_S
from tests.fakes import docker_env
from tests.fakes.processes import (
    GatewayProcess,
    fake_vllm_process,
    free_port,
    gateway_process,
    port_is_open,
)
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

MakeContainer = Callable[..., str]
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
STARTUP_DELAY_S = 1.0  # the fake's port stays closed this long (+~0.5 s of Python start-up)
HTTP_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


# --- helpers -----------------------------------------------------------------------------------


def unique(prefix: str = "ms-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def docker_backend(container: str, port: int, model: str, **overrides: Any) -> dict[str, Any]:
    """A lazy backend run as `container`, listening on 127.0.0.1:`port`."""
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": [model],
        "runtime": {"kind": "docker", "container": container, "stop_timeout_s": 5},
        "lifecycle": "lazy",
        "vram_mib": 1000,
        "start_timeout_s": 30,
        "max_wait_s": 30,
        **overrides,
    }


def gateway_config(docker_url: str, backends: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "docker": {"url": docker_url, "timeout_s": 5},
        "health_interval_s": 0.5,
        "reaper_interval_s": 0.2,
        **extra,
        "backends": backends,
    }


@contextmanager
def running_gateway(config: dict[str, Any]) -> Iterator[GatewayProcess]:
    """The gateway, once it has asked the engine about its containers (API negotiated), so
    a test's first request does not race the adoption check at start-up."""
    with gateway_process(config) as gw:

        def negotiated() -> bool:
            """the gateway negotiated the Docker API version"""
            return "docker api negotiated" in gw.log()

        until_sync(negotiated, timeout_s=10)
        yield gw


def client(gw: GatewayProcess, *, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def chat(gw: GatewayProcess, model: str, *, timeout: float = 30) -> ChatCompletion:
    with client(gw, timeout=timeout) as sdk:
        return sdk.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)


def chat_error(gw: GatewayProcess, model: str) -> openai.APIStatusError:
    """The error a chat request to `model` gets (fails the test if it succeeds)."""
    with pytest.raises(openai.APIStatusError) as info:
        chat(gw, model)
    return info.value


def error_body(exc: openai.APIStatusError) -> dict[str, Any]:
    assert isinstance(exc.body, dict), exc.body
    return exc.body


def state(engine: docker_env.DockerEngine, container: str) -> dict[str, Any]:
    """`State` of the container as the engine reports it (not through the proxy)."""
    result: dict[str, Any] = docker_env.inspect_container(engine, container)["State"]
    return result


def start_events(engine: docker_env.DockerEngine, container: str, since: float) -> list[Any]:
    """The engine's `start` events for `container` since `since` (wall clock), up to now."""
    until = time.time() + 0.2
    with engine.client() as api:
        response = api.get(
            "/events",
            params={
                "since": f"{since:.9f}",
                "until": f"{until:.9f}",
                "filters": json.dumps({"container": [container], "event": ["start"]}),
            },
        )
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def backend_info(gw: GatewayProcess, name: str) -> dict[str, Any]:
    response = httpx.get(gw.url + "/backends", timeout=HTTP_TIMEOUT)
    assert response.status_code == 200, response.text
    [found] = [b for b in response.json()["backends"] if b["name"] == name]
    result: dict[str, Any] = found
    return result


def metric(gw: GatewayProcess, sample: str, **labels: str) -> float:
    """One sample of the gateway's /metrics, e.g. metric(gw, "..._total", backend="x")."""
    text = httpx.get(gw.url + "/metrics", timeout=HTTP_TIMEOUT).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {sample}{labels} in /metrics:\n{text}")


def starts(gw: GatewayProcess, backend: str, outcome: str) -> float:
    return metric(gw, "microscheduler_backend_starts_total", backend=backend, outcome=outcome)


def stops(gw: GatewayProcess, backend: str, reason: str) -> float:
    return metric(gw, "microscheduler_backend_stops_total", backend=backend, reason=reason)


def debug(gw: GatewayProcess, engine: docker_env.DockerEngine | None = None, *names: str) -> str:
    """The gateway's log and the containers' logs, for assertion messages."""
    parts = [f"--- gateway log ---\n{gw.log()}"]
    for name in names:
        assert engine is not None
        parts.append(f"--- container {name} ---\n{docker_env.container_logs(engine, name)}")
    return "\n".join(parts)


# --- 1. cold start -----------------------------------------------------------------------------


def test_cold_request_wakes_the_stopped_container(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port, name = free_port(), unique()
    make_fake_vllm_container(name, port, model="cold-model", startup_delay=STARTUP_DELAY_S)
    config = gateway_config(docker_proxy.url, {"cold": docker_backend(name, port, "cold-model")})
    with running_gateway(config) as gw:
        assert state(docker_engine, name)["Status"] == "created"
        assert backend_info(gw, "cold")["state"] == "stopped"

        began = time.monotonic()
        reply = chat(gw, "cold-model")
        took = time.monotonic() - began

        assert reply.model == "cold-model"
        assert reply.choices[0].message.content, reply
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 4
        assert took >= STARTUP_DELAY_S, took  # the request was held while it loaded
        engine_state = state(docker_engine, name)
        assert engine_state["Status"] == "running", debug(gw, docker_engine, name)
        info = backend_info(gw, "cold")
        assert info["state"] == "ready", info
        assert info["healthy"] is True, info
        assert info["last_start_s"] >= STARTUP_DELAY_S, info
        assert info["runtime_detail"] == "running", info
        assert starts(gw, "cold", "ready") == 1.0
        # The server that answered is the one in this container, started by this request.
        stats = httpx.get(f"http://127.0.0.1:{port}/_fake/stats", timeout=HTTP_TIMEOUT).json()
        assert stats["completed"] == 1, stats
        assert len(start_events(docker_engine, name, since=time.time() - 60)) == 1


# --- 2. single-flight start --------------------------------------------------------------------


def test_concurrent_cold_requests_start_the_container_once(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port, name = free_port(), unique()
    make_fake_vllm_container(name, port, model="busy-model", startup_delay=STARTUP_DELAY_S)
    config = gateway_config(docker_proxy.url, {"busy": docker_backend(name, port, "busy-model")})
    with running_gateway(config) as gw:
        since = time.time() - 1
        barrier = threading.Barrier(8, timeout=10)

        def one(_: int) -> ChatCompletion:
            barrier.wait()
            return chat(gw, "busy-model")

        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(one, range(8), timeout=60))

        assert [r.model for r in replies] == ["busy-model"] * 8
        assert all(r.choices[0].message.content for r in replies)
        assert starts(gw, "busy", "ready") == 1.0, debug(gw)
        assert starts(gw, "busy", "failed") == 0.0
        assert metric(gw, "microscheduler_requests_waiting", backend="busy") == 0.0
        assert (
            metric(
                gw,
                "microscheduler_requests_total",
                backend="busy",
                endpoint="chat_completions",
                status="200",
            )
            == 8.0
        )
        # The engine saw exactly one start, and the one server answered all eight.
        events = start_events(docker_engine, name, since=since)
        assert len(events) == 1, events
        inspected = docker_env.inspect_container(docker_engine, name)
        assert inspected["State"]["Status"] == "running"
        assert inspected["RestartCount"] == 0
        stats = httpx.get(f"http://127.0.0.1:{port}/_fake/stats", timeout=HTTP_TIMEOUT).json()
        assert stats["completed"] == 8, stats


# --- 3. drain on stop --------------------------------------------------------------------------


def test_admin_stop_during_a_stream_lets_the_stream_finish(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port, name = free_port(), unique()
    paced = ("--tokens-per-second", "10", "--max-tokens", "20")  # 20 tokens over ~2 s
    make_fake_vllm_container(
        name, port, model="paced-model", startup_delay=STARTUP_DELAY_S, extra_args=paced
    )
    backend = docker_backend(name, port, "paced-model", drain_timeout_s=30)
    with running_gateway(gateway_config(docker_proxy.url, {"paced": backend})) as gw:
        started = httpx.post(gw.url + "/backends/paced/start", timeout=HTTP_TIMEOUT)
        assert started.status_code == 200, started.text
        assert started.json()["state"] == "ready"

        first_token = threading.Event()
        tokens: list[str] = []
        events: list[str] = []

        def stream() -> float:
            """Reads the whole stream; returns when its last byte arrived."""
            body = {"model": "paced-model", "messages": MESSAGES, "stream": True}
            with httpx.stream(
                "POST", gw.url + "/v1/chat/completions", json=body, timeout=HTTP_TIMEOUT
            ) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line.removeprefix("data: ")
                    events.append(data)
                    if data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    assert "error" not in chunk, chunk
                    if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        tokens.append(chunk["choices"][0]["delta"]["content"])
                        first_token.set()
            return time.monotonic()

        def stop() -> tuple[httpx.Response, float]:
            response = httpx.post(gw.url + "/backends/paced/stop", timeout=HTTP_TIMEOUT)
            return response, time.monotonic()

        with ThreadPoolExecutor(2) as pool:
            streaming = pool.submit(stream)
            assert first_token.wait(15), debug(gw, docker_engine, name)
            stopping = pool.submit(stop)

            def draining() -> bool:
                """the backend is stopping with the stream still in flight"""
                info = backend_info(gw, "paced")
                return bool(info["state"] == "stopping" and info["in_flight"] == 1)

            until_sync(draining, timeout_s=5)
            assert "[DONE]" not in events  # the stop waits for the stream ...
            assert state(docker_engine, name)["Status"] == "running"  # ... before stopping

            stream_ended = streaming.result(timeout=30)
            stop_response, stop_returned = stopping.result(timeout=30)

        assert len(tokens) == 20, (tokens, debug(gw))
        assert events[-1] == "[DONE]", events
        assert stop_response.status_code == 200, stop_response.text
        assert stop_response.json()["state"] == "stopped", stop_response.json()
        assert stop_returned > stream_ended
        engine_state = state(docker_engine, name)
        assert engine_state["Status"] == "exited", debug(gw, docker_engine, name)
        assert not port_is_open(port)
        assert stops(gw, "paced", "admin") == 1.0
        assert metric(gw, "microscheduler_drain_timeouts_total", backend="paced") == 0.0


# --- 4. idle stop ------------------------------------------------------------------------------


def test_idle_backend_is_stopped_and_wakes_again(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port, name = free_port(), unique()
    make_fake_vllm_container(name, port, model="idle-model", startup_delay=STARTUP_DELAY_S)
    backend = docker_backend(name, port, "idle-model", idle_ttl_s=1)
    with running_gateway(gateway_config(docker_proxy.url, {"idle": backend})) as gw:
        chat(gw, "idle-model")
        answered = time.monotonic()
        first_start = state(docker_engine, name)["StartedAt"]

        def exited() -> bool:
            """the engine shows the idle container exited"""
            return bool(state(docker_engine, name)["Status"] == "exited")

        until_sync(exited, timeout_s=15)
        assert time.monotonic() - answered >= 0.9  # idle_ttl_s, less clock slack

        def stopped() -> bool:
            """the gateway says stopped (the engine can show the exit before the stop
            call's answer reaches the gateway)"""
            return bool(backend_info(gw, "idle")["state"] == "stopped")

        until_sync(stopped, timeout_s=10)
        info = backend_info(gw, "idle")
        assert info["reason"] == "stopped by the gateway (idle)", info
        assert info["holds_vram"] is False, info
        assert stops(gw, "idle", "idle") == 1.0

        since = time.time()
        reply = chat(gw, "idle-model")
        assert reply.choices[0].message.content
        assert state(docker_engine, name)["StartedAt"] != first_start
        assert len(start_events(docker_engine, name, since=since)) == 1
        assert starts(gw, "idle", "ready") == 2.0


# --- 5. VRAM zones -----------------------------------------------------------------------------


def test_zone_acquire_evicts_and_blocks_wakes_until_released(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port, name = free_port(), unique()
    make_fake_vllm_container(name, port, model="lazy-model", startup_delay=STARTUP_DELAY_S)
    with fake_vllm_process("pinned-model") as pinned_url:
        backends = {
            # Not managed, but counted: it holds its vram_mib from the gateway's start on.
            "pinned": {"url": pinned_url, "models": ["pinned-model"], "vram_mib": 8000},
            "lazy": docker_backend(name, port, "lazy-model", vram_mib=10000),
        }
        config = gateway_config(
            docker_proxy.url, backends, gpu={"probe": "sim", "sim": {"total_mib": 20000}}
        )
        with running_gateway(config) as gw:
            assert chat(gw, "lazy-model").choices[0].message.content
            assert state(docker_engine, name)["Status"] == "running"
            zones = httpx.get(gw.url + "/vram/zones", timeout=HTTP_TIMEOUT).json()
            assert zones["gpus"][0]["placed_mib"] == 18000, zones

            acquired = httpx.post(
                gw.url + "/vram/zones/imagegen/acquire",
                json={"mib": 10000, "holder": "comfyui"},
                timeout=HTTP_TIMEOUT,
            )
            assert acquired.status_code == 200, (acquired.text, debug(gw))
            grant = acquired.json()
            assert grant["stopped"] == ["lazy"], grant
            assert grant["freed_mib"] == 10000, grant
            assert grant["free_mib"] == 2000, grant
            assert state(docker_engine, name)["Status"] == "exited"
            assert stops(gw, "lazy", "zone") == 1.0

            since = time.time()
            blocked = chat_error(gw, "lazy-model")
            assert blocked.status_code == 503
            assert blocked.code == "backend_blocked", blocked.body
            assert "'imagegen'" in error_body(blocked)["message"], blocked.body
            assert "'comfyui'" in error_body(blocked)["message"], blocked.body
            assert backend_info(gw, "lazy")["blocked_by"], backend_info(gw, "lazy")
            time.sleep(0.5)  # give a wrongly started wake the time to reach the engine
            assert state(docker_engine, name)["Status"] == "exited"
            assert start_events(docker_engine, name, since=since) == []
            # The pinned backend is untouched by the zone.
            assert chat(gw, "pinned-model").choices[0].message.content

            released = httpx.post(gw.url + "/vram/zones/imagegen/release", timeout=HTTP_TIMEOUT)
            assert released.status_code == 200, released.text
            assert released.json()["unblocked"] == ["lazy"]
            assert chat(gw, "lazy-model").choices[0].message.content
            assert state(docker_engine, name)["Status"] == "running"
            assert starts(gw, "lazy", "ready") == 2.0


# --- 6. the proxy forbids a call ---------------------------------------------------------------


def test_proxy_without_start_permission_gives_a_clear_error(
    docker_engine: docker_env.DockerEngine,
    make_fake_vllm_container: MakeContainer,
    tmp_path: Path,
) -> None:
    allow_start = "http-request allow if { method POST } container_start"
    original = docker_env.PROXY_CONFIG.read_text()
    assert original.count(allow_start) == 1
    config_path = tmp_path / "haproxy-no-start.cfg"
    config_path.write_text(
        "\n".join(line for line in original.splitlines() if allow_start not in line) + "\n"
    )
    port, name = free_port(), unique()
    make_fake_vllm_container(name, port, model="denied-model", startup_delay=STARTUP_DELAY_S)
    with docker_env.docker_proxy(docker_engine.socket, config=config_path) as proxy:
        backend = docker_backend(name, port, "denied-model")
        with running_gateway(gateway_config(proxy.url, {"denied": backend})) as gw:
            denied = chat_error(gw, "denied-model")
            assert denied.status_code == 503, denied.body
            assert denied.code == "backend_failed", denied.body
            message = error_body(denied)["message"]
            assert f"forbids POST /containers/{name}/start" in message, message
            assert "allow container start" in message, message
            assert proxy.url in message, message
            assert httpx.get(gw.url + "/health", timeout=HTTP_TIMEOUT).status_code == 200
            assert state(docker_engine, name)["Status"] == "created"  # never started
            assert starts(gw, "denied", "failed") == 1.0

            def logged() -> bool:
                """haproxy logged the denied start"""
                return any(
                    f"/containers/{name}/start" in line and " 403 " in line
                    for line in proxy.log().splitlines()
                )

            until_sync(logged, timeout_s=5)


# --- 7. the proxy is down ----------------------------------------------------------------------


def test_proxy_down_gives_503_and_the_gateway_recovers_when_it_returns(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port, name = free_port(), unique()
    make_fake_vllm_container(name, port, model="far-model", startup_delay=STARTUP_DELAY_S)
    config = gateway_config(docker_proxy.url, {"far": docker_backend(name, port, "far-model")})
    with running_gateway(config) as gw:
        docker_proxy.stop()
        down = chat_error(gw, "far-model")
        failed_at = time.monotonic()
        assert down.status_code == 503, down.body
        assert down.code == "backend_failed", down.body
        message = error_body(down)["message"]
        assert f"cannot reach the Docker API at {docker_proxy.url}" in message, (message, gw.log())
        assert down.response.headers["retry-after"] == str(math.ceil(RESTART_BACKOFF_S))
        assert httpx.get(gw.url + "/health", timeout=HTTP_TIMEOUT).status_code == 200
        assert backend_info(gw, "far")["state"] == "failed"
        assert state(docker_engine, name)["Status"] == "created"

        docker_proxy.start()
        # Within the restart backoff the failure is repeated, not retried.
        backoff = chat_error(gw, "far-model")
        assert time.monotonic() - failed_at < RESTART_BACKOFF_S  # (else this proves nothing)
        assert backoff.status_code == 503
        assert backoff.code == "backend_failed", backoff.body
        assert error_body(backoff)["message"] == message
        assert 1 <= int(backoff.response.headers["retry-after"]) <= RESTART_BACKOFF_S
        assert state(docker_engine, name)["Status"] == "created"

        def served() -> ChatCompletion | None:
            """a request succeeds once the proxy is back and the backoff is over"""
            try:
                return chat(gw, "far-model")
            except openai.APIStatusError as exc:
                if exc.code != "backend_failed":
                    pytest.fail(f"unexpected error while waiting for the restart: {exc.body}")
                return None

        reply = until_sync(served, timeout_s=RESTART_BACKOFF_S + 15, interval_s=0.25)
        assert reply.choices[0].message.content
        assert time.monotonic() - failed_at >= RESTART_BACKOFF_S
        assert state(docker_engine, name)["Status"] == "running"
        assert starts(gw, "far", "failed") == 1.0
        assert starts(gw, "far", "ready") == 1.0


# --- 8. the container exits while it starts ----------------------------------------------------


def test_container_exiting_during_start_fails_fast_with_its_exit_code(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port, name = free_port(), unique()
    # argparse rejects the flag: python exits with code 2 before it ever listens.
    make_fake_vllm_container(
        name, port, model="broken-model", startup_delay=STARTUP_DELAY_S, extra_args=["--bogus"]
    )
    backend = docker_backend(name, port, "broken-model", start_timeout_s=60, max_wait_s=60)
    with running_gateway(gateway_config(docker_proxy.url, {"broken": backend})) as gw:
        began = time.monotonic()
        failed = chat_error(gw, "broken-model")
        took = time.monotonic() - began
        assert took < 10, took  # the exit is noticed, not the 60 s start timeout
        assert failed.status_code == 503
        assert failed.code == "backend_failed", failed.body
        message = error_body(failed)["message"]
        assert "exited with code 2" in message, (message, debug(gw, docker_engine, name))
        engine_state = state(docker_engine, name)
        assert engine_state["Status"] == "exited"
        assert engine_state["ExitCode"] == 2
        assert "--bogus" in docker_env.container_logs(docker_engine, name)
        info = backend_info(gw, "broken")
        assert info["state"] == "failed", info
        assert starts(gw, "broken", "failed") == 1.0

        # Within the backoff the failure is repeated: the container is not started again.
        since = time.time()
        again = chat_error(gw, "broken-model")
        assert again.code == "backend_failed"
        assert "exited with code 2" in error_body(again)["message"]
        assert start_events(docker_engine, name, since=since) == []
        assert state(docker_engine, name)["StartedAt"] == engine_state["StartedAt"]


# --- 9. a stop that fails ----------------------------------------------------------------------


def test_admin_stop_that_cannot_reach_the_proxy_is_not_reported_as_done(
    docker_engine: docker_env.DockerEngine,
    docker_proxy: docker_env.DockerProxy,
    make_fake_vllm_container: MakeContainer,
) -> None:
    port, name = free_port(), unique()
    make_fake_vllm_container(name, port, model="kept-model", startup_delay=STARTUP_DELAY_S)
    config = gateway_config(docker_proxy.url, {"kept": docker_backend(name, port, "kept-model")})
    with running_gateway(config) as gw:
        started = httpx.post(gw.url + "/backends/kept/start", timeout=HTTP_TIMEOUT)
        assert started.status_code == 200, started.text
        docker_proxy.stop()
        stopped = httpx.post(gw.url + "/backends/kept/stop", timeout=HTTP_TIMEOUT)
        # The container keeps running: the stop never reached the engine ...
        assert state(docker_engine, name)["Status"] == "running"
        assert stops(gw, "kept", "admin") == 0.0
        # ... so the admin API must not answer it like a successful stop (as
        # POST /backends/{name}/start answers 503 when the start failed).
        assert stopped.status_code == 503, stopped.text
        assert "cannot reach the Docker API" in stopped.json()["error"]["message"], stopped.text
