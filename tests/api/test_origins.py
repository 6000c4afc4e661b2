"""Browser pages of other sites cannot drive the gateway (`app.api.origin_guard.OriginGuard`,
`app.access.origins`): a cross-origin "simple request" (text/plain POST, no preflight) is refused
on admin routes, and on model routes while no client key is configured; listed origins
(`MICROSCHEDULER_ALLOWED_ORIGINS`) get CORS; admin routes check `Host` (DNS rebinding).
`/metrics` needs the admin key beyond loopback; `/docs` (a CDN's scripts) is gone.
The same through `microscheduler serve` as a process: tests/e2e/test_origins_served.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from app.settings import Settings
from tests.fakes.servers import Gateway, chat, fake_vllm, gateway, gateway_settings

EVIL = "http://evil.example"
CHAT_APP = "http://chat.example:3000"
OWN = "http://localhost"  # the in-process client's base URL: `Host: localhost`
BACKENDS = {"b": {"url": "http://127.0.0.1:9", "models": ["m"]}}
SIMPLE = {"content-type": "text/plain"}  # a "simple request": no preflight


def settings(tmp_path: Path, **fields: Any) -> Settings:
    return gateway_settings(BACKENDS, gpu={"probe": "sim"}, state_dir=tmp_path, **fields)


async def yield_state(gw: Gateway) -> str:
    response = await gw.client.get("/vram/yield")
    assert response.status_code == 200
    state: str = response.json()["state"]
    return state


def assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "permission_denied"
    assert "MICROSCHEDULER_ALLOWED_ORIGINS" in error["message"]
    assert "access-control-allow-origin" not in response.headers


async def test_a_cross_origin_simple_post_does_not_yield_the_gpu(tmp_path: Path) -> None:
    async with gateway(settings(tmp_path)) as gw:
        response = await gw.client.post(
            "/vram/yield", content=b"{}", headers={**SIMPLE, "origin": EVIL}
        )
        assert_refused(response)
        assert await yield_state(gw) == "none"


async def test_origin_null_is_refused_too(tmp_path: Path) -> None:
    async with gateway(settings(tmp_path)) as gw:
        response = await gw.client.post(
            "/vram/yield", content=b"{}", headers={**SIMPLE, "origin": "null"}
        )
        assert_refused(response)
        assert await yield_state(gw) == "none"


async def test_a_listed_origin_is_served_with_cors_headers(tmp_path: Path) -> None:
    async with gateway(settings(tmp_path, allowed_origins=[CHAT_APP])) as gw:
        response = await gw.client.post(
            "/vram/yield", content=b"{}", headers={**SIMPLE, "origin": CHAT_APP}
        )
        assert response.status_code == 200, response.text
        assert response.headers["access-control-allow-origin"] == CHAT_APP
        assert "Origin" in response.headers.get_list("vary")
        assert await yield_state(gw) == "yielded"


@pytest.mark.parametrize("origin", [OWN, None], ids=["same-origin", "no-origin"])
async def test_same_origin_and_no_origin_are_served(tmp_path: Path, origin: str | None) -> None:
    headers = {"content-type": "application/json"} | ({"origin": origin} if origin else {})
    async with gateway(settings(tmp_path)) as gw:
        response = await gw.client.post("/vram/yield", content=b"{}", headers=headers)
        assert response.status_code == 200, response.text
        assert "access-control-allow-origin" not in response.headers
        assert await yield_state(gw) == "yielded"


async def test_the_control_page_requests_pass(tmp_path: Path) -> None:
    """What page.js sends from http://127.0.0.1:PORT/ui: same-origin POSTs carry Origin,
    its GETs (`/status/stream`'s fetch, `/profiles`) do not."""
    async with gateway(settings(tmp_path)) as gw:
        page = {"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}
        response = await gw.client.post(
            "/vram/yield",
            json={"include_pinned": False},
            headers={**page, "content-type": "application/json"},
        )
        assert response.status_code == 200, response.text
        response = await gw.client.get("/profiles", headers={"host": "127.0.0.1:8080"})
        assert response.status_code == 200, response.text


async def test_a_rebinding_page_with_its_own_origin_is_refused(tmp_path: Path) -> None:
    """DNS rebinding: Origin and Host agree, but Host does not name the gateway."""
    rebound = {"host": "evil.example:8080", "origin": "http://evil.example:8080"}
    async with gateway(settings(tmp_path)) as gw:
        response = await gw.client.post("/vram/yield", content=b"{}", headers={**SIMPLE, **rebound})
        assert response.status_code == 403
        assert await yield_state(gw) == "none"
        response = await gw.client.post("/v1/chat/completions", json=chat("m"), headers=rebound)
        assert_refused(response)


async def test_a_model_route_refuses_other_origins_without_client_keys(tmp_path: Path) -> None:
    async with (
        fake_vllm(models=["m"], max_tokens=2) as server,
        gateway(gateway_settings({"b": {"url": server.url, "models": ["m"]}})) as gw,
    ):
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        for path in ("/v1/chat/completions", "/tokenize"):
            response = await gw.client.post(path, content=body, headers={**SIMPLE, "origin": EVIL})
            assert_refused(response)
        response = await gw.client.get("/v1/models", headers={"origin": EVIL})
        assert_refused(response)
        assert (await server.stats())["requests"] == []
        response = await gw.client.post("/v1/chat/completions", content=body, headers=SIMPLE)
        assert response.status_code == 200, response.text
        assert len((await server.stats())["requests"]) == 1


async def test_with_client_keys_the_key_protects_model_routes_not_the_origin() -> None:
    async with (
        fake_vllm(models=["m"], max_tokens=2) as server,
        gateway(
            gateway_settings(
                {"b": {"url": server.url, "models": ["m"]}}, api_keys=(SecretStr("k1"),)
            )
        ) as gw,
    ):
        headers = {"origin": EVIL, "authorization": "Bearer k1"}
        response = await gw.client.post("/v1/chat/completions", json=chat("m"), headers=headers)
        assert response.status_code == 200, response.text
        assert "access-control-allow-origin" not in response.headers
        response = await gw.client.post(
            "/v1/chat/completions", json=chat("m"), headers={"origin": EVIL}
        )
        assert response.status_code == 401


async def test_a_listed_origin_may_use_the_models_with_cors(tmp_path: Path) -> None:
    async with (
        fake_vllm(models=["m"], max_tokens=2) as server,
        gateway(
            gateway_settings(
                {"b": {"url": server.url, "models": ["m"]}}, allowed_origins=[CHAT_APP]
            )
        ) as gw,
    ):
        response = await gw.client.post(
            "/v1/chat/completions", json=chat("m"), headers={"origin": CHAT_APP}
        )
        assert response.status_code == 200, response.text
        assert response.headers["access-control-allow-origin"] == CHAT_APP
        assert "x-request-id" in response.headers["access-control-expose-headers"]


PREFLIGHT = {
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, content-type, x-stainless-os",
}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/vram/yield"])
async def test_preflight_of_a_listed_origin_is_answered(tmp_path: Path, path: str) -> None:
    async with gateway(settings(tmp_path, allowed_origins=[CHAT_APP])) as gw:
        response = await gw.client.options(path, headers={**PREFLIGHT, "origin": CHAT_APP})
    assert response.status_code == 204
    assert response.headers["access-control-allow-origin"] == CHAT_APP
    assert "POST" in response.headers["access-control-allow-methods"]
    allowed = {h.strip() for h in response.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-stainless-os"} <= allowed
    assert "Origin" in response.headers.get_list("vary")


@pytest.mark.parametrize("keys", [(), (SecretStr("k1"),)], ids=["no-keys", "client-keys"])
async def test_preflight_of_another_origin_gets_no_cors(
    tmp_path: Path, keys: tuple[SecretStr, ...]
) -> None:
    async with gateway(settings(tmp_path, allowed_origins=[CHAT_APP], api_keys=keys)) as gw:
        for path in ("/v1/chat/completions", "/vram/yield"):
            response = await gw.client.options(path, headers={**PREFLIGHT, "origin": EVIL})
            assert_refused(response)
            assert not any(h.startswith("access-control-") for h in response.headers)


@pytest.mark.parametrize(
    ("host", "fields", "status"),
    [
        ("evil.example", {}, 403),
        ("evil.example:8080", {}, 403),
        ("127.0.0.1:8080", {}, 200),
        ("localhost", {}, 200),
        ("[::1]:9", {}, 200),
        ("gpu.example", {"allowed_hosts": ["gpu.example"]}, 200),
        ("chat.example", {"allowed_origins": [CHAT_APP]}, 200),
        ("evil.example", {"allowed_hosts": ["*"]}, 200),
    ],
)
async def test_admin_routes_check_host(
    tmp_path: Path, host: str, fields: dict[str, Any], status: int
) -> None:
    async with gateway(settings(tmp_path, **fields)) as gw:
        response = await gw.client.get("/status", headers={"host": host})
    assert response.status_code == status, response.text
    if status == 403:
        error = response.json()["error"]
        assert error["code"] == "permission_denied"
        assert "MICROSCHEDULER_ALLOWED_HOSTS" in error["message"]


async def test_host_is_not_checked_on_model_routes(tmp_path: Path) -> None:
    """Clients name the gateway as they reach it (a LAN name, an IP): the model APIs do
    not care, and a rebinding page sends Origin, which is checked."""
    async with gateway(settings(tmp_path)) as gw:
        response = await gw.client.get("/v1/models", headers={"host": "gpu-box.lan:8080"})
    assert response.status_code == 200


async def test_with_an_admin_key_the_page_works_from_any_name_but_not_other_origins(
    tmp_path: Path,
) -> None:
    """A remote control page (http://gpu-box.lan:8080/ui) sends its own origin and the
    key; Host is not checked (a rebinding page has no key). Another origin stays refused."""
    fields = {"admin_key": SecretStr("admin-secret"), "host": "0.0.0.0"}
    page = {"host": "gpu-box.lan:8080", "authorization": "Bearer admin-secret"}
    async with gateway(settings(tmp_path, **fields), client_host="10.1.2.3") as gw:
        response = await gw.client.post(
            "/vram/yield", content=b"{}", headers={**SIMPLE, **page, "origin": EVIL}
        )
        assert_refused(response)
        own = {**page, "origin": "http://gpu-box.lan:8080"}
        response = await gw.client.post("/vram/yield", content=b"{}", headers={**SIMPLE, **own})
        assert response.status_code == 200, response.text
        response = await gw.client.get("/status", headers=page)
        assert response.status_code == 200, response.text


@asynccontextmanager
async def metrics_gateway(tmp_path: Path, **fields: Any) -> AsyncIterator[Gateway]:
    async with gateway(settings(tmp_path, admin_key=SecretStr("admin-secret"), **fields)) as gw:
        yield gw


async def test_metrics_need_the_admin_key_beyond_loopback(tmp_path: Path) -> None:
    async with metrics_gateway(tmp_path, host="0.0.0.0") as gw:
        response = await gw.client.get("/metrics")
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert "microscheduler_" not in response.text
        response = await gw.client.get("/metrics", headers={"authorization": "Bearer admin-secret"})
        assert response.status_code == 200
        assert "microscheduler_" in response.text


async def test_metrics_beyond_loopback_without_an_admin_key_follow_the_admin_rule(
    tmp_path: Path,
) -> None:
    # Like every admin route without an admin key: loopback clients only, not the LAN.
    lan = settings(tmp_path, host="0.0.0.0")
    async with gateway(lan, client_host="192.168.1.23") as gw:
        response = await gw.client.get("/metrics")
        assert response.status_code == 403
        assert "loopback" in response.json()["error"]["message"]
        assert "microscheduler_" not in response.text
    async with gateway(lan) as gw:  # from 127.0.0.1
        response = await gw.client.get("/metrics", headers={"host": "127.0.0.1:8080"})
        assert response.status_code == 200
        assert "microscheduler_" in response.text
    public = settings(tmp_path, host="0.0.0.0", metrics_public=True)
    async with gateway(public, client_host="192.168.1.23") as gw:
        assert (await gw.client.get("/metrics")).status_code == 200


@pytest.mark.parametrize(
    "fields", [{"host": "127.0.0.1"}, {"host": "0.0.0.0", "metrics_public": True}]
)
async def test_metrics_stay_open_on_loopback_or_when_public(
    tmp_path: Path, fields: dict[str, Any]
) -> None:
    async with metrics_gateway(tmp_path, **fields) as gw:
        response = await gw.client.get("/metrics")
    assert response.status_code == 200
    assert "microscheduler_" in response.text


async def test_metrics_on_loopback_refuse_a_rebound_host(tmp_path: Path) -> None:
    async with gateway(settings(tmp_path)) as gw:
        response = await gw.client.get("/metrics", headers={"host": "evil.example:8080"})
        assert response.status_code == 403
        assert "MICROSCHEDULER_ALLOWED_HOSTS" in response.json()["error"]["message"]
        assert "microscheduler_" not in response.text
        response = await gw.client.get("/metrics", headers={"host": "127.0.0.1:8080"})
        assert response.status_code == 200


async def test_no_docs_pages_only_the_schema(tmp_path: Path) -> None:
    async with gateway(settings(tmp_path)) as gw:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            response = await gw.client.get(path)
            assert response.status_code == 404, path
            assert response.json()["error"]["code"] == "not_found"
        assert (await gw.client.get("/openapi.json")).status_code == 200
