"""The admin dependency as routes will use it: key when configured, else loopback only."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from app.api.deps import AdminDep
from tests.fakes.servers import gateway, gateway_settings

BACKENDS = {"b": {"url": "http://127.0.0.1:9", "models": ["m"]}}


def add_probe(app: FastAPI) -> None:
    async def probe() -> dict[str, bool]:
        return {"admin": True}

    app.add_api_route("/admin-probe", probe, methods=["POST"], dependencies=[AdminDep])


@pytest.mark.parametrize(("host", "status"), [("127.0.0.1", 200), ("10.1.2.3", 403)])
async def test_without_admin_key_only_loopback_clients_pass(host: str, status: int) -> None:
    async with gateway(gateway_settings(BACKENDS), client_host=host, configure=add_probe) as gw:
        response = await gw.client.post("/admin-probe")
    assert response.status_code == status
    if status == 403:
        assert response.json()["error"]["code"] == "permission_denied"


@pytest.mark.parametrize(
    ("header", "status"),
    [("Bearer admin-secret", 200), ("Bearer client-key", 401), (None, 401)],
)
async def test_with_admin_key_the_key_is_needed_even_on_loopback(
    header: str | None, status: int
) -> None:
    settings = gateway_settings(
        BACKENDS, admin_key=SecretStr("admin-secret"), api_keys=(SecretStr("client-key"),)
    )
    headers = {"authorization": header} if header else {}
    async with gateway(settings, client_host="10.1.2.3", configure=add_probe) as gw:
        response = await gw.client.post("/admin-probe", headers=headers)
    assert response.status_code == status
    if status == 401:
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert "admin-secret" not in response.text
