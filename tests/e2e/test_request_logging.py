"""What a real gateway process logs of hostile requests: a client leaving mid-body is an
INFO line and a 499, never a traceback or a 500; a `%0a` in a path cannot forge a line."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.fakes.processes import gateway_process
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

CONFIG = {"backends": {"m": {"url": "http://127.0.0.1:9", "models": ["m"]}}}


def raw(url: str, data: bytes) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)


def test_a_client_leaving_mid_body_and_a_forged_line() -> None:
    with gateway_process(CONFIG, env={"MICROSCHEDULER_ACCESS_LOG": "true"}) as gw:
        raw(gw.url, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n"
                    b"content-type: application/json\r\n\r\n" + b'{"model": ')  # fmt: skip
        until_sync(lambda: "client disconnected before its request body" in gw.log(), timeout_s=5)
        forged = "2026-01-01 00:00:00,000 INFO app.access request_id=forged request status=200"
        raw(gw.url, b"GET /nothing%0a" + forged.replace(" ", "%20").encode()
                    + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")  # fmt: skip
        until_sync(lambda: "path=/nothing\\n2026" in gw.log(), timeout_s=5)
        metrics = httpx.get(gw.url + "/metrics", timeout=5).text
        log = gw.log()
    assert "Traceback" not in log, log
    assert not any(line.startswith("2026-01-01") for line in log.splitlines()), log
    assert 'endpoint="chat_completions",model="",status="499"} 1.0' in metrics, metrics
    assert 'status="500"' not in metrics
