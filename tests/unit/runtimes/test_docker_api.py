"""The Docker Engine API client against respx (and one real Unix socket server)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from app.runtimes.base import RuntimeFailure
from app.runtimes.docker_api import STOP_GRACE_S, DockerApi, DockerError
from app.settings import DockerConfig

URL = "http://docker-proxy:2375"
HAPROXY_403 = (
    "<html><body><h1>403 Forbidden</h1>\nRequest forbidden by administrative rules.\n"
    "</body></html>\n"
)


def ping_ok(version: str = "1.41") -> httpx.Response:
    return httpx.Response(200, text="OK", headers={"Api-Version": version})


def inspect_body(
    status: str = "running",
    *,
    exit_code: int = 0,
    oom: bool = False,
    error: str = "",
    health: str | None = None,
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "Status": status,
        "Running": status in ("running", "paused"),
        "Paused": status == "paused",
        "Restarting": status == "restarting",
        "OOMKilled": oom,
        "Dead": status == "dead",
        "Pid": 4242 if status == "running" else 0,
        "ExitCode": exit_code,
        "Error": error,
        "StartedAt": "2026-01-02T03:04:05.123456789Z",
        "FinishedAt": "0001-01-01T00:00:00Z",
    }
    if health is not None:
        state["Health"] = {"Status": health, "FailingStreak": 0, "Log": []}
    return {"Id": "c0ffee" * 10 + "abcd", "Name": "/vllm-reasoning", "State": state}


def engine_error(status: int, message: str) -> httpx.Response:
    return httpx.Response(status, json={"message": message})


@pytest.fixture
def docker() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=URL, assert_all_called=False) as router:
        yield router


@pytest.fixture
async def api() -> AsyncIterator[DockerApi]:
    client = DockerApi(DockerConfig(url=URL, timeout_s=10.0))
    yield client
    await client.aclose()


# --- version negotiation -------------------------------------------------------------


async def test_uses_the_servers_version_when_older_than_ours(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    ping = docker.get("/_ping").mock(return_value=ping_ok("1.41"))
    inspect = docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        return_value=httpx.Response(200, json=inspect_body())
    )

    await api.inspect("vllm-reasoning")
    await api.inspect("vllm-reasoning")

    assert api.api_version == "1.41"
    assert inspect.call_count == 2
    assert ping.call_count == 1  # negotiated once, then cached


async def test_clamps_a_newer_server_to_our_maximum(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok("1.52"))
    start = docker.post("/v1.47/containers/vllm-reasoning/start").mock(
        return_value=httpx.Response(204)
    )

    await api.start("vllm-reasoning")

    assert start.called
    assert api.api_version == "1.47"


async def test_ping_is_unversioned_and_returns_the_negotiated_version(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    ping = docker.get("/_ping").mock(return_value=ping_ok("1.44"))

    assert await api.ping() == "1.44"
    assert ping.calls.last.request.url.path == "/_ping"


async def test_a_server_below_the_minimum_is_refused(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok("1.12"))

    with pytest.raises(DockerError) as caught:
        await api.inspect("vllm-reasoning")

    assert caught.value.reason == "unsupported"
    assert "1.12" in str(caught.value)
    assert "1.24" in str(caught.value)
    assert api.api_version is None


async def test_a_failed_ping_is_not_cached_and_the_next_call_retries(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    ping = docker.get("/_ping").mock(
        side_effect=[httpx.ConnectError("Connection refused"), ping_ok("1.41")]
    )
    docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        return_value=httpx.Response(200, json=inspect_body())
    )

    with pytest.raises(DockerError) as caught:
        await api.inspect("vllm-reasoning")
    assert caught.value.reason == "unreachable"
    assert api.api_version is None

    info = await api.inspect("vllm-reasoning")

    assert info.running
    assert ping.call_count == 2


async def test_concurrent_first_calls_negotiate_once(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    ping = docker.get("/_ping").mock(return_value=ping_ok("1.41"))
    docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        return_value=httpx.Response(200, json=inspect_body())
    )

    await asyncio.gather(*(api.inspect("vllm-reasoning") for _ in range(10)))

    assert ping.call_count == 1


async def test_a_client_version_error_drops_the_cached_version(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    ping = docker.get("/_ping").mock(side_effect=[ping_ok("1.47"), ping_ok("1.41")])
    docker.get("/v1.47/containers/vllm-reasoning/json").mock(
        return_value=engine_error(
            400, "client version 1.47 is too new. Maximum supported API version is 1.41"
        )
    )
    docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        return_value=httpx.Response(200, json=inspect_body())
    )

    with pytest.raises(DockerError) as caught:
        await api.inspect("vllm-reasoning")
    assert caught.value.reason == "bad_request"
    assert "too new" in str(caught.value)

    await api.inspect("vllm-reasoning")  # renegotiated with the replaced engine

    assert ping.call_count == 2
    assert api.api_version == "1.41"


# --- start and stop --------------------------------------------------------------------


@pytest.mark.parametrize(("status", "already_running"), [(204, False), (304, True)])
async def test_start_sends_no_body_and_reports_already_running(
    docker: respx.MockRouter, api: DockerApi, status: int, already_running: bool
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    start = docker.post("/v1.41/containers/vllm-reasoning/start").mock(
        return_value=httpx.Response(status)
    )

    assert await api.start("vllm-reasoning") is already_running

    request = start.calls.last.request
    assert request.content == b""  # the engine rejects a start with a body
    assert "content-type" not in request.headers


@pytest.mark.parametrize(("status", "already_stopped"), [(204, False), (304, True)])
async def test_stop_passes_t_and_waits_longer_than_t(
    docker: respx.MockRouter, api: DockerApi, status: int, already_stopped: bool
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    stop = docker.post("/v1.41/containers/vllm-reasoning/stop").mock(
        return_value=httpx.Response(status)
    )

    assert await api.stop("vllm-reasoning", 30) is already_stopped

    request = stop.calls.last.request
    assert request.url.params["t"] == "30"
    assert "signal" not in request.url.params  # only honoured from API 1.42
    timeout = request.extensions["timeout"]
    assert timeout["read"] == 30 + 10.0 + STOP_GRACE_S
    assert timeout["connect"] == 10.0


async def test_other_calls_use_the_configured_timeout(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    ping = docker.get("/_ping").mock(return_value=ping_ok())
    inspect = docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        return_value=httpx.Response(200, json=inspect_body())
    )

    await api.inspect("vllm-reasoning")

    for route in (ping, inspect):
        timeout = route.calls.last.request.extensions["timeout"]
        assert timeout == {"connect": 10.0, "read": 10.0, "write": 10.0, "pool": 10.0}


# --- inspect ---------------------------------------------------------------------------


async def test_inspect_maps_a_running_container_without_healthcheck(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        return_value=httpx.Response(200, json=inspect_body("running"))
    )

    info = await api.inspect("vllm-reasoning")

    assert info.running
    assert info.status == "running"
    assert info.health is None
    assert info.name == "vllm-reasoning"  # without the engine's leading "/"
    assert info.id.startswith("c0ffee")
    assert info.started_at == "2026-01-02T03:04:05.123456789Z"
    assert info.finished_at == "0001-01-01T00:00:00Z"


async def test_inspect_maps_health_and_oom(docker: respx.MockRouter, api: DockerApi) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    docker.get("/v1.41/containers/healthy/json").mock(
        return_value=httpx.Response(200, json=inspect_body("running", health="starting"))
    )
    docker.get("/v1.41/containers/oom/json").mock(
        return_value=httpx.Response(
            200, json=inspect_body("exited", exit_code=137, oom=True, error="out of memory")
        )
    )

    healthy = await api.inspect("healthy")
    oom = await api.inspect("oom")

    assert healthy.health == "starting"
    assert not oom.running
    assert (oom.status, oom.exit_code, oom.oom_killed, oom.error) == (
        "exited",
        137,
        True,
        "out of memory",
    )


async def test_a_paused_container_is_not_running(docker: respx.MockRouter, api: DockerApi) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        return_value=httpx.Response(200, json=inspect_body("paused"))  # State.Running is true
    )

    info = await api.inspect("vllm-reasoning")

    assert not info.running


async def test_an_unreadable_inspect_answer_is_a_docker_error(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        return_value=httpx.Response(200, json={"Id": "x"})
    )

    with pytest.raises(DockerError) as caught:
        await api.inspect("vllm-reasoning")

    assert caught.value.reason == "unexpected"
    assert "vllm-reasoning" in str(caught.value)


# --- errors ----------------------------------------------------------------------------


async def test_not_found_names_the_container_and_the_config_key(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        return_value=engine_error(404, "No such container: vllm-reasoning")
    )

    with pytest.raises(DockerError) as caught:
        await api.inspect("vllm-reasoning", config_key="backends.reasoning.runtime.container")

    assert isinstance(caught.value, RuntimeFailure)
    assert (caught.value.reason, caught.value.status) == ("not_found", 404)
    assert str(caught.value) == (
        "container 'vllm-reasoning' not found (backends.reasoning.runtime.container): "
        "No such container: vllm-reasoning"
    )


async def start(api: DockerApi) -> bool:
    return await api.start("vllm-reasoning")


async def stop(api: DockerApi) -> bool:
    return await api.stop("vllm-reasoning", 5)


@pytest.mark.parametrize(
    ("call", "action", "permission"),
    [("start", start, "ALLOW_START=1"), ("stop", stop, "ALLOW_STOP=1")],
)
async def test_a_proxy_403_on_start_or_stop_names_the_permission(
    docker: respx.MockRouter,
    api: DockerApi,
    call: str,
    action: Callable[[DockerApi], Awaitable[bool]],
    permission: str,
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    route = docker.post(f"/v1.41/containers/vllm-reasoning/{call}").mock(
        return_value=httpx.Response(403, text=HAPROXY_403, headers={"Content-Type": "text/html"})
    )

    with pytest.raises(DockerError) as caught:
        await action(api)

    message = str(caught.value)
    assert (caught.value.reason, caught.value.status) == ("forbidden", 403)
    assert f"POST /containers/vllm-reasoning/{call}" in message
    assert "Request forbidden by administrative rules." in message
    assert "<html>" not in message
    assert "Tecnativa docker-socket-proxy: CONTAINERS=1 POST=1" in message
    assert f"linuxserver socket-proxy: CONTAINERS=1 {permission}" in message
    assert route.call_count == 1  # a 403 is configuration, never retried


async def test_a_proxy_403_on_inspect_asks_for_containers(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        return_value=httpx.Response(403, text=HAPROXY_403)
    )

    with pytest.raises(DockerError) as caught:
        await api.inspect("vllm-reasoning")

    assert "GET /containers/vllm-reasoning/json" in str(caught.value)
    assert "CONTAINERS=1" in str(caught.value)


async def test_a_proxy_403_on_ping_asks_for_ping(docker: respx.MockRouter, api: DockerApi) -> None:
    ping = docker.get("/_ping").mock(return_value=httpx.Response(403, text=HAPROXY_403))

    with pytest.raises(DockerError) as caught:
        await api.inspect("vllm-reasoning")

    assert caught.value.reason == "forbidden"
    assert "GET /_ping" in str(caught.value)
    assert "PING=1" in str(caught.value)
    assert ping.call_count == 1


async def test_connect_error_names_the_url(docker: respx.MockRouter, api: DockerApi) -> None:
    docker.get("/_ping").mock(side_effect=httpx.ConnectError("[Errno 111] Connection refused"))

    with pytest.raises(DockerError) as caught:
        await api.ping()

    assert (caught.value.reason, caught.value.status) == ("unreachable", None)
    assert str(caught.value) == (
        "cannot reach the Docker API at http://docker-proxy:2375: [Errno 111] Connection "
        "refused (is the socket proxy running? see docker.url / MICROSCHEDULER_DOCKER__URL)"
    )


async def test_a_timeout_names_the_call_and_the_timeout(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    docker.post("/v1.41/containers/vllm-reasoning/stop").mock(
        side_effect=httpx.ReadTimeout("timed out")
    )

    with pytest.raises(DockerError) as caught:
        await api.stop("vllm-reasoning", 30)

    assert caught.value.reason == "timeout"
    assert "POST /containers/vllm-reasoning/stop" in str(caught.value)
    assert f"{30 + 10 + STOP_GRACE_S:g}s" in str(caught.value)


async def test_a_lost_connection_is_a_docker_error(
    docker: respx.MockRouter, api: DockerApi
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    docker.get("/v1.41/containers/vllm-reasoning/json").mock(
        side_effect=httpx.RemoteProtocolError("Server disconnected without sending a response.")
    )

    with pytest.raises(DockerError) as caught:
        await api.inspect("vllm-reasoning")

    assert caught.value.reason == "unexpected"
    assert "Server disconnected" in str(caught.value)


@pytest.mark.parametrize(
    ("response", "reason", "text"),
    [
        (
            engine_error(409, "cannot start a paused container, try unpause instead"),
            "conflict",
            "cannot start a paused container, try unpause instead",
        ),
        (engine_error(500, "driver failed"), "server_error", "driver failed"),
        (
            httpx.Response(
                503,
                text="<html><body><h1>503 Service Unavailable</h1>\n"
                "No server is available to handle this request.\n</body></html>",
            ),
            "server_error",
            "503 Service Unavailable No server is available to handle this request.",
        ),
        (httpx.Response(418, text=""), "unexpected", "HTTP 418"),
    ],
)
async def test_status_errors_carry_the_engine_message(
    docker: respx.MockRouter,
    api: DockerApi,
    response: httpx.Response,
    reason: str,
    text: str,
) -> None:
    docker.get("/_ping").mock(return_value=ping_ok())
    docker.post("/v1.41/containers/vllm-reasoning/start").mock(return_value=response)

    with pytest.raises(DockerError) as caught:
        await api.start("vllm-reasoning")

    assert (caught.value.reason, caught.value.status) == (reason, response.status_code)
    assert str(caught.value).endswith(text)
    assert "POST /containers/vllm-reasoning/start" in str(caught.value)


# --- Unix socket -----------------------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # A short path: Unix socket paths are limited to about 100 bytes.
    with tempfile.TemporaryDirectory(prefix="ms-") as name:
        yield Path(name)


async def test_a_unix_url_talks_to_the_socket(socket_dir: Path) -> None:
    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
        seen.append(f"{method} {target}")
        if target == "/_ping":
            status, headers, body = "200 OK", "Api-Version: 1.41\r\n", b"OK"
        else:
            status, headers, body = "200 OK", "", json.dumps(inspect_body()).encode()
        writer.write(
            f"HTTP/1.1 {status}\r\n{headers}Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    path = socket_dir / "docker.sock"
    server = await asyncio.start_unix_server(handle, path=str(path))
    api = DockerApi(DockerConfig(url=f"unix://{path}", timeout_s=5.0))
    try:
        info = await api.inspect("vllm-reasoning")
    finally:
        await api.aclose()
        server.close()
        await server.wait_closed()

    assert info.running
    assert seen == ["GET /_ping", "GET /v1.41/containers/vllm-reasoning/json"]


async def test_a_missing_unix_socket_is_unreachable(socket_dir: Path) -> None:
    url = f"unix://{socket_dir}/missing.sock"
    api = DockerApi(DockerConfig(url=url, timeout_s=5.0))
    try:
        with pytest.raises(DockerError) as caught:
            await api.ping()
    finally:
        await api.aclose()

    assert caught.value.reason == "unreachable"
    assert f"cannot reach the Docker API at {url}" in str(caught.value)
    assert "socket mounted and readable" in str(caught.value)
