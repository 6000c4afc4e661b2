"""What the gateway logs of a request: a client leaving mid-body is a client's close (499,
no traceback, no 500 counted); control characters a client put in its path cannot forge a
line; no credential header is logged at any level."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from app import logs
from app.cli.serve import server_options
from app.main import create_app
from app.settings import Settings
from tests.fakes.servers import Gateway, gateway, gateway_settings, seams_for_tests
from tests.fakes.waits import until


@pytest.fixture
async def gw() -> AsyncIterator[Gateway]:
    settings = gateway_settings({"m": {"url": "http://127.0.0.1:9", "models": ["m"]}})
    async with gateway(settings) as gw:
        yield gw


async def leave_mid_body(app: Any, path: str) -> list[dict[str, Any]]:
    """An ASGI request declaring 1000 bytes whose client sends 10 and disconnects, as
    uvicorn delivers it; returns what the app sent."""
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": b'{"model": ', "more_body": True}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080),
        "headers": [(b"content-length", b"1000"), (b"content-type", b"application/json")],
    }  # fmt: skip
    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize(
    ("path", "endpoint"),
    [("/v1/chat/completions", "chat_completions"), ("/v1/messages", "messages"),
     ("/vram/yield", None)],
)  # fmt: skip
async def test_a_client_leaving_mid_body_is_a_clients_close_not_a_500(
    gw: Gateway, path: str, endpoint: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        await leave_mid_body(gw.app, path)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    gone = [r for r in caplog.records if "client disconnected before its request body" in
            r.getMessage()]  # fmt: skip
    assert [r.levelno for r in gone] == [logging.INFO]
    if endpoint is not None:
        requests = {
            sample.labels["status"]: sample.value
            for metric in gw.registry.collect() if metric.name == "microscheduler_requests"
            for sample in metric.samples if sample.name == "microscheduler_requests_total"
            and sample.labels["endpoint"] == endpoint
        }  # fmt: skip
        assert requests == {"499": 1.0}


@pytest.fixture
def log_out() -> Iterator[io.StringIO]:
    """The gateway's own log configuration (`logs.configure`), written to a string."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stream = io.StringIO()
    logs.configure("INFO", stream=stream)
    try:
        yield stream
    finally:
        logs.drain()
        root.handlers[:] = handlers
        root.setLevel(level)


FORGED = "2026-01-01 00:00:00,000 INFO app.access request_id=forged request status=200"


async def test_control_characters_in_a_path_cannot_forge_a_log_line(
    log_out: io.StringIO,
) -> None:
    settings = gateway_settings({"m": {"url": "http://127.0.0.1:9", "models": ["m"]}},
                                access_log=True)  # fmt: skip
    async with gateway(settings) as gw:
        for bad in ("%0a", "%0d", "%0d%0a", "%e2%80%a8", "%1b[2J"):
            response = await gw.client.get(f"/nothing{bad}{quote(FORGED)}")
            assert response.status_code == 404
    logs.drain()
    lines = log_out.getvalue().splitlines()
    access = [line for line in lines if " app.access " in line]
    assert len(access) == 5, lines
    assert not any(line.startswith("2026-01-01") for line in lines)
    assert all("path=/nothing\\" in line for line in access)
    assert "path=/nothing\\n2026-01-01 00:00:00,000 INFO app.access" in access[0]


def test_a_message_is_one_line_and_its_traceback_keeps_its_lines(log_out: io.StringIO) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("app.test").exception("unhandled error path=%s", "/x\n" + FORGED)
    text = log_out.getvalue()
    assert "unhandled error path=/x\\n2026-01-01 00:00:00,000 INFO app.access" in text
    assert not any(line.startswith("2026-01-01") for line in text.splitlines())
    assert "\nTraceback (most recent call last):\n" in text


@asynccontextmanager
async def real_server(settings: Settings) -> AsyncIterator[int]:
    """The gateway under uvicorn as `serve` runs it, in this loop, on a free port."""
    options = {**server_options(settings), "port": 0}
    app = create_app(settings, seams=seams_for_tests(None), registry=CollectorRegistry())
    server = uvicorn.Server(uvicorn.Config(app, **options))
    task = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started, timeout_s=10)
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


SECRETS = {"authorization": "Bearer sekrit-bearer", "x-api-key": "sekrit-x", "api-key": "sekrit-a"}


async def test_a_websocket_upgrade_logs_no_credential_at_debug(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    settings = gateway_settings(
        {"m": {"url": "http://127.0.0.1:9", "models": ["m"]}}, state_dir=tmp_path
    )
    caplog.set_level(logging.DEBUG)
    async with real_server(settings) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = (
            "GET /v1/realtime HTTP/1.1\r\nhost: gateway\r\nupgrade: websocket\r\n"
            "connection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "sec-websocket-version: 13\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in SECRETS.items())
            + "\r\n"
        )
        writer.write(head.encode())
        status = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        await writer.wait_closed()
    logged = "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)
    assert caplog.records  # DEBUG was on and something was logged
    for secret in SECRETS.values():
        assert secret.split()[-1] not in logged, logged
    assert status.startswith(b"HTTP/1.1 404"), status  # no WebSocket here: a plain 404
