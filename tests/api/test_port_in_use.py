"""Another server on a backend's port (issue 31, point 2): the start is refused with
`port_in_use`, not "ready" on the other server's health check, and nothing is relayed to
it; a server that answers but lists other models is not ours either."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from app.runtimes import port_check
from app.runtimes.base import Runtime
from app.services import Seams
from app.settings import BackendConfig
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeVllmRuntime,
    chat,
    fake_vllm,
    gateway,
    gateway_settings,
    until_backend,
)


def lazy_backend(port: int, **runtime: Any) -> dict[str, Any]:
    command = ["{python}", "-m", "app.sim.vllm", "--port", str(port), "--model", "lazy-model"]
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": ["lazy-model"],
        "lifecycle": "lazy",
        "vram_mib": 1000,
        "runtime": {"kind": "process", "command": command, **runtime},
    }


async def test_a_port_another_server_answers_on_refuses_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(port_check, "FREE_WAIT_S", 0.2)  # the squatter stays: no need to wait
    async with fake_vllm(models=["other-model"]) as squatter:
        port = urlsplit(squatter.url).port
        assert port is not None
        settings = gateway_settings({"lazy": lazy_backend(port)}, state_dir=tmp_path)
        async with gateway(settings) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat("lazy-model"))
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["code"] == "backend_port_in_use"
            assert error["type"] == "server_error"
            assert error["message"].startswith(
                f"backend 'lazy' failed: port_in_use: port {port} of backend 'lazy' already "
                "answers before its launch (another server: an orphan, another user's server, "
                "a second gateway); free it or give the backend another port"
            )
            assert int(response.headers["retry-after"]) >= 1
            view = await until_backend(gw, "lazy", state="failed")
            assert view["reason"].startswith(f"port_in_use: port {port}")
        paths = [r["path"] for r in (await squatter.stats())["requests"]]
        assert "/v1/chat/completions" not in paths  # nothing relayed to it
    assert not (tmp_path / "logs" / "lazy.log").exists()  # nothing launched


async def test_a_server_listing_other_models_is_not_ours_and_the_start_fails(
    tmp_path: Path,
) -> None:
    """What answered the start's health check serves another model (a server that came up
    on the port after the check, or ours under another --served-model-name)."""
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["other-model"])

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtime

    settings = gateway_settings({"lazy": lazy_backend(port)}, state_dir=tmp_path)
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
        response = await gw.client.post("/v1/chat/completions", json=chat("lazy-model"))
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "backend_port_in_use"
        assert (
            f"the server at http://127.0.0.1:{port} lists 'other-model' in /v1/models, not "
            "'lazy-model' (backends.lazy.models[0])"
        ) in error["message"]
        assert runtime.stops == 1  # ours stopped
        await until_backend(gw, "lazy", state="failed")
