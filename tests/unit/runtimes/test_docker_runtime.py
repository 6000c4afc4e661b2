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


# --- placements: one container per set of GPUs ------------------------------------------------

GPU0, GPU1 = "qwen-gpu0", "qwen-gpu1"


def placed_answer(name: str, status: str, *, exit_code: int = 0) -> httpx.Response:
    answer = inspect_answer(status, exit_code=exit_code)
    body = answer.json()
    body["Name"] = f"/{name}"
    return httpx.Response(200, json=body)


def route(docker: respx.MockRouter, method: str, name: str, action: str) -> respx.Route:
    path = f"/v1.41/containers/{name}/{action}"
    return docker.get(path) if method == "GET" else docker.post(path)


@pytest.fixture
def placed(api: DockerApi) -> DockerRuntime:
    config = DockerRuntimeConfig.model_validate(
        {
            "kind": "docker",
            "placements": [{"gpus": [0], "container": GPU0}, {"gpus": [1], "container": GPU1}],
            "stop_timeout_s": 20,
        }
    )
    return DockerRuntime("qwen", config, api)


async def test_start_starts_the_container_of_the_chosen_gpus(
    docker: respx.MockRouter, placed: DockerRuntime
) -> None:
    route(docker, "GET", GPU0, "json").mock(return_value=placed_answer(GPU0, "exited"))
    start0 = route(docker, "POST", GPU0, "start").mock(return_value=httpx.Response(204))
    start1 = route(docker, "POST", GPU1, "start").mock(return_value=httpx.Response(204))

    await placed.start((1,))

    assert (start0.call_count, start1.call_count) == (0, 1)
    assert placed.describe() == "docker container 'qwen-gpu1' via http://docker-proxy:2375"


async def test_start_is_refused_while_another_placement_runs(
    docker: respx.MockRouter, placed: DockerRuntime
) -> None:
    route(docker, "GET", GPU1, "json").mock(return_value=placed_answer(GPU1, "running"))
    start0 = route(docker, "POST", GPU0, "start").mock(return_value=httpx.Response(204))

    with pytest.raises(RuntimeFailure) as caught:
        await placed.start((0,))

    assert not start0.called  # never two placements of one backend at once
    assert str(caught.value) == (
        "cannot start container 'qwen-gpu0' of backend qwen: container 'qwen-gpu1' "
        "(backends.qwen.runtime.placements[1].container, GPU 1) is running, started outside "
        "this gateway, and both serve on the backend's URL; stop it (docker stop qwen-gpu1) "
        "and the gateway starts the one it chose"
    )


async def test_start_on_gpus_without_a_placement_names_the_placements(
    docker: respx.MockRouter, placed: DockerRuntime
) -> None:
    with pytest.raises(RuntimeFailure) as caught:
        await placed.start((2,))

    assert str(caught.value) == (
        "no container of backends.qwen.runtime.placements is on GPUs [2] "
        "(its placements: qwen-gpu0 on GPU 0, qwen-gpu1 on GPU 1)"
    )


async def test_status_after_a_restart_finds_the_running_placement_and_its_gpus(
    docker: respx.MockRouter, placed: DockerRuntime
) -> None:
    route(docker, "GET", GPU0, "json").mock(return_value=placed_answer(GPU0, "exited"))
    route(docker, "GET", GPU1, "json").mock(return_value=placed_answer(GPU1, "running"))

    status = await placed.status()

    assert status == RuntimeStatus(running=True, detail="qwen-gpu1: running", gpus=(1,))
    assert placed.describe() == "docker container 'qwen-gpu1' via http://docker-proxy:2375"


async def test_status_with_none_running_is_the_first_placements(
    docker: respx.MockRouter, placed: DockerRuntime
) -> None:
    route(docker, "GET", GPU0, "json").mock(return_value=placed_answer(GPU0, "created"))
    route(docker, "GET", GPU1, "json").mock(return_value=placed_answer(GPU1, "exited"))

    status = await placed.status()

    assert status == RuntimeStatus(
        running=False, detail="qwen-gpu0: created (never started)", gpus=(0,)
    )


async def test_status_with_two_placements_up_is_a_runtime_error(
    docker: respx.MockRouter, placed: DockerRuntime
) -> None:
    route(docker, "GET", GPU0, "json").mock(return_value=placed_answer(GPU0, "running"))
    route(docker, "GET", GPU1, "json").mock(return_value=placed_answer(GPU1, "running"))

    with pytest.raises(RuntimeFailure) as caught:
        await placed.status()

    assert str(caught.value) == (
        "containers 'qwen-gpu0' and 'qwen-gpu1' of backend qwen are all up, and they serve "
        "on one URL: stop all but one (docker stop NAME)"
    )


async def test_status_of_a_missing_placement_names_its_config_key(
    docker: respx.MockRouter, placed: DockerRuntime
) -> None:
    route(docker, "GET", GPU0, "json").mock(return_value=placed_answer(GPU0, "exited"))
    route(docker, "GET", GPU1, "json").mock(
        return_value=httpx.Response(404, json={"message": f"No such container: {GPU1}"})
    )

    with pytest.raises(RuntimeFailure) as caught:
        await placed.status()

    assert str(caught.value) == (
        "container 'qwen-gpu1' not found (backends.qwen.runtime.placements[1].container): "
        "No such container: qwen-gpu1"
    )


async def test_status_after_a_start_is_the_started_placements(
    docker: respx.MockRouter, placed: DockerRuntime
) -> None:
    route(docker, "GET", GPU0, "json").mock(return_value=placed_answer(GPU0, "exited"))
    inspect1 = route(docker, "GET", GPU1, "json").mock(
        return_value=placed_answer(GPU1, "exited", exit_code=1)
    )
    route(docker, "POST", GPU1, "start").mock(return_value=httpx.Response(204))
    await placed.start((1,))

    status = await placed.status()

    assert status == RuntimeStatus(
        running=False, exit_code=1, detail="qwen-gpu1: exited (1)", gpus=(1,)
    )
    assert inspect1.call_count == 1  # the started one only: no search


async def test_stop_after_a_restart_stops_the_running_placement(
    docker: respx.MockRouter, placed: DockerRuntime
) -> None:
    route(docker, "GET", GPU0, "json").mock(return_value=placed_answer(GPU0, "exited"))
    route(docker, "GET", GPU1, "json").mock(
        side_effect=[placed_answer(GPU1, "running"), placed_answer(GPU1, "exited")]
    )
    stop0 = route(docker, "POST", GPU0, "stop").mock(return_value=httpx.Response(304))
    stop1 = route(docker, "POST", GPU1, "stop").mock(return_value=httpx.Response(204))

    await placed.stop()

    assert (stop0.call_count, stop1.call_count) == (0, 1)
    assert stop1.calls.last.request.url.params["t"] == "20"


async def test_logs_after_a_restart_are_the_running_placements(
    docker: respx.MockRouter, placed: DockerRuntime
) -> None:
    route(docker, "GET", GPU0, "json").mock(return_value=placed_answer(GPU0, "exited"))
    route(docker, "GET", GPU1, "json").mock(return_value=placed_answer(GPU1, "running"))
    frame = b"\x01\x00\x00\x00\x00\x00\x00\x06ready\n"
    logs1 = route(docker, "GET", GPU1, "logs").mock(return_value=httpx.Response(200, content=frame))

    lines = [line async for line in await placed.logs(tail=10, follow=False)]

    assert lines == ["ready\n"]
    assert logs1.call_count == 1
