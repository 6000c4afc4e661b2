"""The socket proxy's allow-list (deploy/docker-socket-proxy/haproxy.cfg) against the real
Docker Engine through the real haproxy: what the gateway needs passes, the rest is 403."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import docker_env
from tests.fakes.processes import free_port, port_is_open, wait_for
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

TIMEOUT = httpx.Timeout(15.0, connect=3.0)
FORBIDDEN = "forbidden by the docker socket proxy"


@pytest.fixture
def proxy(docker_proxy: docker_env.DockerProxy) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=docker_proxy.url, timeout=TIMEOUT) as client:
        yield client


@pytest.fixture
def v(docker_engine: docker_env.DockerEngine) -> str:
    """The version prefix a client would negotiate, e.g. /v1.41."""
    return f"/v{docker_engine.api_version}"


def raw(client: httpx.Client, method: str, target: str, **kwargs: Any) -> httpx.Response:
    """Send `target` exactly as written (httpx would otherwise resolve `..` segments)."""
    return client.request(method, target, extensions={"target": target.encode()}, **kwargs)


def assert_forbidden(response: httpx.Response) -> None:
    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == "application/json"
    assert FORBIDDEN in response.json()["message"]


# --- allowed ---------------------------------------------------------------------------------


@pytest.mark.parametrize("versioned", [False, True], ids=["plain", "versioned"])
def test_ping_is_allowed_with_get_and_head(proxy: httpx.Client, v: str, versioned: bool) -> None:
    path = f"{v}/_ping" if versioned else "/_ping"
    got = proxy.get(path)
    assert got.status_code == 200
    assert got.text == "OK"
    assert got.headers["api-version"] == v.removeprefix("/v")
    head = proxy.head(path)
    assert head.status_code == 200
    assert head.headers["api-version"] == v.removeprefix("/v")


@pytest.mark.parametrize("versioned", [False, True], ids=["plain", "versioned"])
def test_version_is_allowed(proxy: httpx.Client, v: str, versioned: bool) -> None:
    response = proxy.get(f"{v}/version" if versioned else "/version")
    assert response.status_code == 200
    assert response.json()["ApiVersion"] == v.removeprefix("/v")


def test_list_and_inspect_are_allowed(
    proxy: httpx.Client, v: str, make_fake_vllm_container: Callable[..., str]
) -> None:
    name = make_fake_vllm_container("ms-test-proxy-list", free_port())
    listed = proxy.get(
        f"{v}/containers/json",
        params={"all": "1", "filters": json.dumps({"label": ["microscheduler.test=1"]})},
    )
    assert listed.status_code == 200
    [summary] = [c for c in listed.json() if f"/{name}" in c["Names"]]
    assert summary["State"] == "created"
    assert summary["Labels"]["microscheduler.test"] == "1"

    for path in (f"{v}/containers/{name}/json", f"/containers/{name}/json"):
        inspected = proxy.get(path)
        assert inspected.status_code == 200
        assert inspected.json()["State"]["Status"] == "created"
        assert inspected.json()["HostConfig"]["NetworkMode"] == "host"

    # Docker's own errors pass through untouched (JSON), unlike the proxy's 403.
    missing = proxy.get(f"{v}/containers/ms-test-no-such-container/json")
    assert missing.status_code == 404
    assert "No such container" in missing.json()["message"]


def test_start_and_stop_pass_and_the_fake_vllm_serves_in_between(
    proxy: httpx.Client,
    v: str,
    docker_engine: docker_env.DockerEngine,
    make_fake_vllm_container: Callable[..., str],
) -> None:
    port = free_port()
    name = make_fake_vllm_container("ms-test-proxy-start", port, startup_delay=2.0)

    started = proxy.post(f"{v}/containers/{name}/start")
    assert started.status_code == 204, started.text
    assert not port_is_open(port), "the fake vLLM's port must stay closed while it 'loads'"
    assert proxy.post(f"{v}/containers/{name}/start").status_code == 304  # already running
    try:
        wait_for(f"http://127.0.0.1:{port}/health", timeout_s=20)
    except AssertionError:
        logs = docker_env.container_logs(docker_engine, name)
        pytest.fail(f"the fake vLLM never answered /health:\n{logs}")
    state = proxy.get(f"{v}/containers/{name}/json").json()["State"]
    assert state["Status"] == "running"
    assert "Health" not in state  # no HEALTHCHECK, like the upstream vllm-openai image

    # What the gateway must not be able to do to a running model, through the proxy.
    assert_forbidden(proxy.post(f"{v}/containers/{name}/kill"))
    assert_forbidden(proxy.post(f"{v}/containers/{name}/restart"))
    assert_forbidden(proxy.post(f"{v}/containers/{name}/exec", json={"Cmd": ["true"]}))
    assert_forbidden(proxy.delete(f"{v}/containers/{name}", params={"force": "1"}))
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=TIMEOUT).status_code == 200

    began = time.monotonic()
    stopped = proxy.post(f"{v}/containers/{name}/stop", params={"t": "5"})
    assert stopped.status_code == 204, stopped.text
    assert time.monotonic() - began < 5, "the fake vLLM exits on SIGTERM, well before t"
    state = proxy.get(f"/containers/{name}/json").json()["State"]
    assert (state["Status"], state["ExitCode"]) == ("exited", 0)
    assert not port_is_open(port)
    assert proxy.post(f"/containers/{name}/stop").status_code == 304  # already stopped


def test_the_event_stream_is_allowed_and_carries_start_and_die(
    docker_proxy: docker_env.DockerProxy, v: str, make_fake_vllm_container: Callable[..., str]
) -> None:
    name = make_fake_vllm_container("ms-test-proxy-events", free_port(), startup_delay=0.0)
    filters = {"type": ["container"], "label": ["microscheduler.test=1"], "container": [name]}
    seen: list[str] = []
    with (
        httpx.Client(base_url=docker_proxy.url, timeout=TIMEOUT) as client,
        client.stream("GET", f"{v}/events", params={"filters": json.dumps(filters)}) as events,
    ):
        assert events.status_code == 200
        assert client.post(f"{v}/containers/{name}/start").status_code == 204
        assert client.post(f"{v}/containers/{name}/stop", params={"t": "5"}).status_code == 204
        for line in events.iter_lines():  # each read is bounded by TIMEOUT's read timeout
            event = json.loads(line)
            assert event["Actor"]["Attributes"]["name"] == name
            seen.append(event["Action"])
            if event["Action"] == "die":
                break
    assert seen[0] == "start"
    assert "die" in seen


# --- denied ----------------------------------------------------------------------------------

DENIED = [
    ("POST", "/containers/create"),
    ("POST", "{v}/containers/create?name=ms-test-evil"),
    ("DELETE", "/containers/x"),
    ("DELETE", "{v}/containers/x?force=1"),
    ("POST", "/containers/x/kill"),
    ("POST", "{v}/containers/x/kill?signal=SIGKILL"),
    ("POST", "/containers/x/exec"),
    ("POST", "{v}/exec/abc/start"),
    ("POST", "{v}/containers/x/restart"),
    ("POST", "{v}/containers/x/update"),
    ("POST", "{v}/containers/x/pause"),
    ("POST", "{v}/containers/x/attach?stream=1"),
    ("GET", "{v}/containers/x/logs?stdout=1"),
    ("GET", "{v}/containers/x/archive?path=/"),
    ("PUT", "{v}/containers/x/archive?path=/"),
    ("POST", "{v}/containers/prune"),
    ("GET", "/images/json"),
    ("GET", "{v}/images/json"),
    ("POST", "{v}/images/create?fromImage=busybox"),
    ("GET", "/info"),
    ("GET", "{v}/info"),
    ("GET", "{v}/system/df"),
    ("POST", "{v}/build"),
    ("GET", "{v}/volumes"),
    ("POST", "{v}/networks/create"),
    # right path, wrong method
    ("GET", "{v}/containers/x/start"),
    ("POST", "{v}/containers/json"),
    ("POST", "/_ping"),
    ("DELETE", "{v}/version"),
    # tricks: dot segments, encoded slashes, doubled slashes, a path hidden in the query
    ("POST", "/containers/x/start/../../create"),
    ("POST", "{v}/containers/x/stop/../../create"),
    ("POST", "{v}/containers/create?x=/start"),
    ("POST", "{v}/containers/../containers/create"),
    ("POST", "{v}/containers/x%2F..%2F..%2Fcreate/start"),
    ("POST", "{v}/containers/x/start%2F..%2Fkill"),
    ("POST", "//containers/create"),
    ("POST", "{v}//containers/x/start"),
    ("POST", "{v}/containers/x/start/"),
    ("GET", "{v}/containers/x/json/../../../info"),
    ("GET", "/_ping/../info"),
    ("GET", "/v1/info"),
]


@pytest.mark.parametrize(("method", "target"), DENIED, ids=[f"{m} {t}" for m, t in DENIED])
def test_everything_else_is_forbidden(
    proxy: httpx.Client, v: str, method: str, target: str
) -> None:
    assert_forbidden(raw(proxy, method, target.format(v=v)))


def test_upgrade_requests_are_forbidden_even_on_allowed_paths(proxy: httpx.Client, v: str) -> None:
    headers = {"Connection": "Upgrade", "Upgrade": "tcp"}
    assert_forbidden(proxy.post(f"{v}/containers/x/start", headers=headers))
    assert_forbidden(proxy.get("/_ping", headers=headers))


def test_the_log_names_requests_but_never_bodies(
    docker_proxy: docker_env.DockerProxy, proxy: httpx.Client
) -> None:
    secret = "ms-test-secret-in-body"
    assert_forbidden(proxy.post("/containers/create", json={"Image": secret}))
    assert proxy.get("/_ping").status_code == 200

    def logged() -> bool:
        """haproxy has written both request lines"""
        log = docker_proxy.log()
        return '"POST /containers/create HTTP/1.1"' in log and '"GET /_ping HTTP/1.1"' in log

    until_sync(logged, timeout_s=5)
    assert secret not in docker_proxy.log()


# --- the proxy itself ------------------------------------------------------------------------


def test_the_proxy_can_go_down_and_come_back(docker_proxy: docker_env.DockerProxy) -> None:
    with httpx.Client(base_url=docker_proxy.url, timeout=TIMEOUT) as client:
        assert client.get("/_ping").status_code == 200
        docker_proxy.stop()
        assert not docker_proxy.running
        with pytest.raises(httpx.ConnectError):
            client.get("/_ping")
        docker_proxy.start()
        assert client.get("/_ping").status_code == 200


def test_an_unreachable_engine_is_a_503_from_the_proxy(
    docker_engine: docker_env.DockerEngine, tmp_path: Path
) -> None:
    with (
        docker_env.docker_proxy(tmp_path / "missing.sock") as proxy,
        httpx.Client(base_url=proxy.url, timeout=TIMEOUT) as client,
    ):
        response = client.get("/_ping")
        assert response.status_code == 503
        assert "text/html" in response.headers["content-type"]  # haproxy's page, not JSON
        assert_forbidden(client.post("/containers/create"))  # the allow-list still applies
