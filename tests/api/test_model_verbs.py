"""The verbs behind a client's load and unload (`app.api.model_verbs`): which backend a
name stands for, who may, and that a load and an unload take the lifecycle's own paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr
from starlette.requests import Request

from app.api.model_verbs import check_lifecycle, lifecycle_target, load, unload
from app.errors import (
    AuthenticationFailed,
    Conflict,
    ModelNotAllowed,
    ModelNotFound,
    PermissionDenied,
)
from app.lifecycle.backend import Backend
from app.lifecycle.state import BackendState
from app.services import Services
from tests.api.test_lifecycle_api import lazy, lifecycle_gateway
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, Gateway
from tests.fakes.waits import until

ADMIN, OPS, AGENT = "admin-secret-verbs", "sk-ops-verbs", "sk-agent-verbs"


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPS_KEY", OPS)
    monkeypatch.setenv("AGENT_KEY", AGENT)


def services_of(gw: Gateway) -> Services:
    services: Services = gw.app.state.services
    return services


def request(gw: Gateway, bearer: str | None, client: str = "192.0.2.7") -> Request:
    """A request as the routes see it: from `client`, with `bearer` as its key."""
    headers = [(b"host", b"127.0.0.1:8080")]
    if bearer is not None:
        headers.append((b"authorization", f"Bearer {bearer}".encode()))
    scope = {"type": "http", "method": "POST", "path": "/models/load", "headers": headers,
             "client": (client, 40000), "app": gw.app}  # fmt: skip
    return Request(scope)


def state(backend: Backend) -> BackendState:
    """Read anew each time (mypy would narrow `backend.state` across awaits)."""
    return backend.state


def keys() -> dict[str, object]:
    return {
        "ops": {"key_env": "OPS_KEY", "lifecycle": True, "models": ["lazy-model"]},
        "agent": {"key_env": "AGENT_KEY"},
    }


async def test_the_admin_and_a_lifecycle_key_may_others_are_told_why(tmp_path: Path) -> None:
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=["lazy-model"])}
    async with lifecycle_gateway(
        {"lazy": lazy(port, aliases=["quick"])}, runtimes, tmp_path,
        admin_key=SecretStr(ADMIN), client_keys={"keys": keys()},
    ) as gw:  # fmt: skip
        services = services_of(gw)
        check_lifecycle(request(gw, ADMIN), services, "lazy-model")
        check_lifecycle(request(gw, OPS), services, "lazy-model")
        with pytest.raises(PermissionDenied) as denied:
            check_lifecycle(request(gw, AGENT), services, "lazy-model")
        assert "Key 'agent' may not load or unload models" in denied.value.message
        assert "lifecycle: true" in denied.value.message
        with pytest.raises(ModelNotAllowed):  # lifecycle, but not for a model out of scope
            check_lifecycle(request(gw, OPS), services, "quick")
        with pytest.raises(AuthenticationFailed):
            check_lifecycle(request(gw, None), services, "lazy-model")


async def test_without_keys_only_loopback_clients_may(tmp_path: Path) -> None:
    """As the admin routes: no admin key, so a loopback client is the admin; the open
    gateway's anonymous client elsewhere has no `lifecycle`."""
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=["lazy-model"])}
    async with lifecycle_gateway({"lazy": lazy(port)}, runtimes, tmp_path) as gw:
        services = services_of(gw)
        check_lifecycle(request(gw, None, client="127.0.0.1"), services, "lazy-model")
        with pytest.raises(PermissionDenied) as denied:
            check_lifecycle(request(gw, None), services, "lazy-model")
        assert "Key 'anonymous'" in denied.value.message


async def test_names_resolve_to_the_backend_or_say_why_not(tmp_path: Path) -> None:
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=["lazy-model"])}
    backends = {"lazy": lazy(port, aliases=["quick"])}
    async with lifecycle_gateway(backends, runtimes, tmp_path) as gw:
        services = services_of(gw)
        for name in ("lazy-model", "quick", "lazy"):
            assert lifecycle_target(services, name).name == "lazy"
        with pytest.raises(ModelNotFound):
            lifecycle_target(services, "nowhere")


async def test_load_waits_or_not_and_unload_releases(tmp_path: Path) -> None:
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=["lazy-model"])}
    async with lifecycle_gateway({"lazy": lazy(port)}, runtimes, tmp_path) as gw:
        services = services_of(gw)
        backend = lifecycle_target(services, "lazy-model")
        assert state(backend) is BackendState.STOPPED
        await load(services, backend, wait=True)
        assert state(backend) is BackendState.READY
        await unload(services_of(gw).backends["lazy"])
        assert state(backend) is BackendState.STOPPED
        assert "unload" in (backend.reason or "")
        await unload(backend)  # idempotent
        await load(services, backend, wait=False)
        assert state(backend) is BackendState.STARTING  # begun, not waited for
        await until(lambda: backend.state is BackendState.READY)


async def test_a_blocked_backend_is_not_loaded(tmp_path: Path) -> None:
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=["lazy-model"])}
    async with lifecycle_gateway({"lazy": lazy(port)}, runtimes, tmp_path) as gw:
        services = services_of(gw)
        answer = await gw.client.post("/vram/yield", json={"reason": "game"})
        assert answer.status_code == 200, answer.text
        backend = lifecycle_target(services, "lazy-model")
        with pytest.raises(Conflict) as refused:
            await load(services, backend, wait=True)
        assert "blocked by" in refused.value.message
        assert backend.state is BackendState.STOPPED
