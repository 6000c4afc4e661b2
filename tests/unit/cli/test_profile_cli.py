"""`microscheduler profile list | activate` against a small real HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from app.cli import build_parser

PROFILES_BODY: dict[str, Any] = {
    "active": "dev",
    "profiles": [
        {
            "name": "dev",
            "active": True,
            "description": "both models loaded",
            "vram_strategy": "shared",
            "gpu_total_gb": 32,
            "target_utilization_pct": 76,
            "enabled": ["orchestrator", "reasoning"],
            "disabled": [],
            "models": {
                "orchestrator": {"enabled": True, "vram_pct": 40, "cuda_graphs": True},
                "reasoning": {"enabled": True, "vram_pct": 35, "sleep_mode": True},
            },
        },
        {
            "name": "production",
            "active": False,
            "description": None,
            "vram_strategy": "shared",
            "gpu_total_gb": None,
            "target_utilization_pct": 92,
            "enabled": ["orchestrator"],
            "disabled": ["reasoning"],
            "models": {
                "orchestrator": {"enabled": True, "vram_pct": 92},
                "reasoning": {"enabled": False},
            },
        },
    ],
}


@dataclass
class FakeGateway:
    """The admin API's profile routes; records the Authorization header of every call."""

    url: str = ""
    auth: list[str | None] = field(default_factory=list)
    require_key: str | None = None

    def _refused(self, request: web.Request) -> web.Response | None:
        self.auth.append(request.headers.get("Authorization"))
        if self.require_key and request.headers.get("Authorization") != (
            f"Bearer {self.require_key}"
        ):
            return error(401, "This endpoint needs the admin key as a Bearer token.")
        return None

    async def list_profiles(self, request: web.Request) -> web.Response:
        return self._refused(request) or web.json_response(PROFILES_BODY)

    async def activate(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        name = request.match_info["name"]
        if name == "broken":
            return web.Response(status=502, text="<html>Bad Gateway</html>")
        if name not in ("dev", "production"):
            return error(404, f"Profile {name!r} does not exist. Profiles: dev, production.")
        return web.json_response(
            {
                "active": name,
                "previous": "dev",
                "disabled": ["reasoning"],
                "enabled": [],
                "stopped": ["reasoning"],
                "started": [],
                "drain_timeouts": [],
            }
        )


def error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
    return web.json_response(body, status=status)


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    fake = FakeGateway()
    app = web.Application()
    app.router.add_get("/profiles", fake.list_profiles)
    app.router.add_post("/profiles/{name}/activate", fake.activate)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield fake
    finally:
        await runner.cleanup()


@pytest.fixture(autouse=True)
def _no_admin_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MICROSCHEDULER_ADMIN_KEY", raising=False)
    monkeypatch.delenv("MICROSCHEDULER_ADMIN_KEY_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no ~/.config/.../admin.key


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


async def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    # The CLI is synchronous (httpx.Client): run it off the loop that serves the fake.
    code = await asyncio.to_thread(_main, argv)
    out, err = capsys.readouterr()
    return code, out, err


async def test_list_prints_a_table_with_the_active_profile_marked(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await run(["profile", "list", "--url", gateway.url], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"gateway {gateway.url}: active profile dev"
    assert lines[2].split() == [
        "profile",
        "strategy",
        "GPU",
        "GiB",
        "target",
        "enabled",
        "disabled",
        "models",
    ]
    assert lines[3].startswith("*  dev ")
    assert "76%" in lines[3]
    assert "orchestrator 40%, reasoning 35% sleep" in lines[3]
    assert lines[4].split()[:4] == ["production", "shared", "-", "92%"]
    assert "reasoning off" in lines[4]
    assert "dev: both models loaded" in lines
    assert gateway.auth == [None]  # no key in the environment: no header


async def test_list_json_is_the_gateways_answer(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await run(["profile", "list", "--url", gateway.url, "--json"], capsys)
    assert (code, err) == (0, "")
    assert json.loads(out) == PROFILES_BODY


async def test_activate_sends_the_admin_key_and_reports_the_change(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway.require_key = "s3cret"
    monkeypatch.setenv("MICROSCHEDULER_ADMIN_KEY", "s3cret")
    code, out, err = await run(["profile", "activate", "production", "--url", gateway.url], capsys)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"gateway {gateway.url}: active profile production (was dev)",
        "stopped: reasoning",
        "started: -",
        "disabled: reasoning",
        "enabled: -",
    ]
    assert gateway.auth == ["Bearer s3cret"]


async def test_activate_json(gateway: FakeGateway, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", "activate", "production", "--url", gateway.url, "--json"]
    code, out, _ = await run(argv, capsys)
    assert code == 0
    assert json.loads(out)["stopped"] == ["reasoning"]


async def test_an_unknown_profile_exits_1_with_the_gateways_message(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await run(["profile", "activate", "gaming", "--url", gateway.url], capsys)
    assert (code, out) == (1, "")
    assert err == (
        "error: profile activate: Profile 'gaming' does not exist. Profiles: dev, production. "
        "(HTTP 404)\n"
    )


async def test_a_missing_admin_key_is_explained(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway.require_key = "s3cret"
    code, _, err = await run(["profile", "list", "--url", gateway.url], capsys)
    assert code == 1
    assert "needs the admin key as a Bearer token." in err
    assert "(no admin key was sent: set MICROSCHEDULER_ADMIN_KEY, write the key to " in err
    assert "or pass --admin-key-file PATH) (HTTP 401)" in err


async def test_an_error_that_is_not_json_still_exits_1(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await run(["profile", "activate", "broken", "--url", gateway.url], capsys)
    assert code == 1
    assert err.startswith("error: profile activate: HTTP 502 Bad Gateway: <html>Bad Gateway")


async def test_an_unreachable_gateway_exits_3_naming_the_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    code, out, err = await run(["profile", "list", "--url", url], capsys)
    assert (code, out) == (3, "")  # not 2: that is argparse's usage error
    assert err.startswith(f"error: profile list: cannot reach the gateway at {url}: ")
    assert "refused" in err.lower()
