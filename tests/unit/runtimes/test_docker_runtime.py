"""DockerRuntime over a respx-mocked Docker Engine API."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from app.runtimes.base import Runtime, RuntimeFailure, RuntimeStatus
from app.runtimes.docker import DockerRuntime
from app.runtimes.docker_api import DockerApi
from app.settings import DockerConfig, DockerRuntimeConfig

URL = "http://docker-proxy:2375"
CONTAINER = "vllm-reasoning"
INSPECT = f"/v1.41/containers/{CONTAINER}/json"
START = f"/v1.41/containers/{CONTAINER}/start"
STOP = f"/v1.41/containers/{CONTAINER}/stop"
NOT_FOUND = httpx.Response(404, json={"message": f"No such container: {CONTAINER}"})


def inspect_answer(
    status: str,
    *,
    exit_code: int = 0,
    oom: bool = False,
    error: str = "",
    health: str | None = None,
) -> httpx.Response:
    state: dict[str, Any] = {
        "Status": status,
        "Running": status in ("running", "paused"),
        "OOMKilled": oom,
        "ExitCode": exit_code,
        "Error": error,
        "StartedAt": "2026-01-02T03:04:05Z",
        "FinishedAt": "2026-01-02T04:05:06Z",
    }
    if health is not None:
        state["Health"] = {"Status": health, "FailingStreak": 0, "Log": []}
    return httpx.Response(200, json={"Id": "abc123", "Name": f"/{CONTAINER}", "State": state})


@pytest.fixture
def docker() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=URL, assert_all_called=False) as router:
        router.get("/_ping").mock(
            return_value=httpx.Response(200, text="OK", headers={"Api-Version": "1.41"})
        )
        yield router


@pytest.fixture
async def api() -> AsyncIterator[DockerApi]:
    client = DockerApi(DockerConfig(url=URL, timeout_s=10.0))
    yield client
    await client.aclose()


@pytest.fixture
def runtime(api: DockerApi) -> DockerRuntime:
    config = DockerRuntimeConfig(kind="docker", container=CONTAINER, stop_timeout_s=20)
    return DockerRuntime("reasoning", config, api)


def test_is_a_managed_runtime_that_outlives_the_gateway(runtime: DockerRuntime) -> None:
    as_protocol: Runtime = runtime  # the type checker checks the protocol
    assert (as_protocol.kind, as_protocol.managed, as_protocol.stop_on_shutdown) == (
        "docker",
        True,
        False,
    )
    assert runtime.describe() == "docker container 'vllm-reasoning' via http://docker-proxy:2375"


# --- start -----------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "already"), [(204, "False"), (304, "True")])
async def test_start_starts_the_container(
    docker: respx.MockRouter,
    runtime: DockerRuntime,
    caplog: pytest.LogCaptureFixture,
    status: int,
    already: str,
) -> None:
    start = docker.post(START).mock(return_value=httpx.Response(status))

    with caplog.at_level(logging.INFO, logger="app.runtimes.docker"):
        await runtime.start()

    assert start.call_count == 1
    assert (
        f"container started backend=reasoning container=vllm-reasoning already_running={already}"
        in caplog.messages
    )


async def test_start_of_a_missing_container_names_the_config_key(
    docker: respx.MockRouter, runtime: DockerRuntime
) -> None:
    docker.post(START).mock(return_value=NOT_FOUND)

    with pytest.raises(RuntimeFailure) as caught:
        await runtime.start()

    assert str(caught.value) == (
        "container 'vllm-reasoning' not found (backends.reasoning.runtime.container): "
        "No such container: vllm-reasoning"
    )


async def test_start_when_the_proxy_is_down_is_a_runtime_error(
    docker: respx.MockRouter, runtime: DockerRuntime
) -> None:
    docker.post(START).mock(side_effect=httpx.ConnectError("[Errno 111] Connection refused"))

    with pytest.raises(RuntimeFailure) as caught:
        await runtime.start()

    assert "cannot reach the Docker API at http://docker-proxy:2375" in str(caught.value)


# --- stop ------------------------------------------------------------------------------


async def test_stop_uses_the_stop_timeout_and_confirms_the_exit(
    docker: respx.MockRouter, runtime: DockerRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    stop = docker.post(STOP).mock(return_value=httpx.Response(204))
    inspect = docker.get(INSPECT).mock(return_value=inspect_answer("exited", exit_code=0))

    with caplog.at_level(logging.INFO, logger="app.runtimes.docker"):
        await runtime.stop()

    assert stop.calls.last.request.url.params["t"] == "20"
    assert stop.calls.last.request.extensions["timeout"]["read"] > 20 + 10
    assert inspect.call_count == 1
    assert any("container stopped backend=reasoning" in m for m in caplog.messages)


async def test_stop_of_a_stopped_container_is_not_an_error(
    docker: respx.MockRouter, runtime: DockerRuntime
) -> None:
    docker.post(STOP).mock(return_value=httpx.Response(304))
    docker.get(INSPECT).mock(return_value=inspect_answer("exited", exit_code=143))

    await runtime.stop()


async def test_stop_of_a_removed_container_is_a_warning_not_an_error(
    docker: respx.MockRouter, runtime: DockerRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    docker.post(STOP).mock(return_value=NOT_FOUND)
    inspect = docker.get(INSPECT).mock(return_value=NOT_FOUND)

    with caplog.at_level(logging.WARNING, logger="app.runtimes.docker"):
        await runtime.stop()

    assert not inspect.called
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "container=vllm-reasoning" in caplog.messages[0]


async def test_stop_fails_when_the_container_still_runs(
    docker: respx.MockRouter, runtime: DockerRuntime
) -> None:
    docker.post(STOP).mock(return_value=httpx.Response(204))
    docker.get(INSPECT).mock(return_value=inspect_answer("restarting", exit_code=137))

    with pytest.raises(RuntimeFailure) as caught:
        await runtime.stop()

    assert "vllm-reasoning" in str(caught.value)
    assert "still restarting" in str(caught.value)
    assert "t=20s" in str(caught.value)


async def test_stop_forbidden_by_the_proxy_is_a_runtime_error(
    docker: respx.MockRouter, runtime: DockerRuntime
) -> None:
    docker.post(STOP).mock(return_value=httpx.Response(403, text="<h1>403 Forbidden</h1>"))

    with pytest.raises(RuntimeFailure) as caught:
        await runtime.stop()

    assert "ALLOW_STOP=1" in str(caught.value)


# --- status ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (inspect_answer("running"), RuntimeStatus(running=True, detail="running")),
        (
            inspect_answer("running", health="starting"),
            RuntimeStatus(running=True, detail="running, health: starting"),
        ),
        (
            inspect_answer("running", health="unhealthy"),
            RuntimeStatus(running=True, detail="running, health: unhealthy"),
        ),
        (
            inspect_answer("exited", exit_code=0, health="healthy"),
            RuntimeStatus(running=False, exit_code=0, detail="exited (0)"),
        ),
        (
            inspect_answer("exited", exit_code=137, oom=True, error="OOM in cgroup"),
            RuntimeStatus(
                running=False, exit_code=137, detail="exited (137), OOM-killed: OOM in cgroup"
            ),
        ),
        (
            inspect_answer("exited", exit_code=1, error="exec: vllm: not found"),
            RuntimeStatus(running=False, exit_code=1, detail="exited (1): exec: vllm: not found"),
        ),
        (
            inspect_answer("dead", exit_code=255),
            RuntimeStatus(running=False, exit_code=255, detail="dead (255)"),
        ),
        (
            inspect_answer("restarting", exit_code=1),
            RuntimeStatus(running=False, exit_code=1, detail="restarting after exit (1)"),
        ),
        (
            inspect_answer("created"),
            RuntimeStatus(running=False, exit_code=None, detail="created (never started)"),
        ),
        (
            inspect_answer("paused"),
            RuntimeStatus(running=False, detail="paused (unpause it with docker unpause)"),
        ),
    ],
)
async def test_status_maps_the_container_state(
    docker: respx.MockRouter,
    runtime: DockerRuntime,
    answer: httpx.Response,
    expected: RuntimeStatus,
) -> None:
    docker.get(INSPECT).mock(return_value=answer)

    assert await runtime.status() == expected


async def test_status_of_a_missing_container_names_the_config_key(
    docker: respx.MockRouter, runtime: DockerRuntime
) -> None:
    docker.get(INSPECT).mock(return_value=NOT_FOUND)

    with pytest.raises(RuntimeFailure) as caught:
        await runtime.status()

    assert str(caught.value) == (
        "container 'vllm-reasoning' not found (backends.reasoning.runtime.container): "
        "No such container: vllm-reasoning"
    )


async def test_status_when_docker_times_out_is_a_runtime_error(
    docker: respx.MockRouter, runtime: DockerRuntime
) -> None:
    docker.get(INSPECT).mock(side_effect=httpx.ReadTimeout("timed out"))

    with pytest.raises(RuntimeFailure) as caught:
        await runtime.status()

    assert "did not answer GET /containers/vllm-reasoning/json within 10s" in str(caught.value)
