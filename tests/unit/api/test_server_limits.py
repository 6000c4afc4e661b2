"""The HTTP server's limits: settings (YAML `server:`, environment over it), what `serve`
hands uvicorn, and the strict JSON reading of `json_object`."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import pytest

from app.api.accept import GatewayServer
from app.api.connections import GatewayProtocol
from app.api.protocol import json_object
from app.api.refusals import raw_response
from app.cli.serve import run_serve
from app.errors import ErrorCode, InvalidRequest, RequestHeadersTooLarge
from app.settings import ConfigError, load_settings

MODELS = """\
backends:
  one: {url: "http://127.0.0.1:8199", models: [m]}
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MICROSCHEDULER_"):
            monkeypatch.delenv(name)


def config(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "models.yaml").write_text(MODELS + extra)
    return tmp_path


def test_defaults(tmp_path: Path) -> None:
    server = load_settings(config(tmp_path)).server
    assert server.max_connections is None  # sized from the file limit by `serve`
    assert server.queue_timeout_s == 60.0
    assert server.header_timeout_s == 10.0
    assert server.body_timeout_s == 60.0
    assert server.keep_alive_s == 30
    assert server.max_header_bytes == 64 * 1024
    assert server.backlog == 65535  # the kernel caps it at somaxconn


def test_yaml_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MICROSCHEDULER_SERVER__BODY_TIMEOUT_S", "2.5")
    server = load_settings(config(tmp_path, "server: {max_connections: 50}\n")).server
    assert server.max_connections == 50
    assert server.body_timeout_s == 2.5


def test_out_of_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(config(tmp_path, "server: {max_connections: 0, max_header_bytes: 10}\n"))
    assert any("max_connections" in p for p in info.value.problems)
    assert any("max_header_bytes" in p for p in info.value.problems)


def test_serve_hands_every_limit_to_uvicorn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[GatewayServer] = []

    def run(server: GatewayServer, sockets: list[socket.socket] | None = None) -> None:
        assert server._listening
        assert sockets is None
        seen.append(server)

    monkeypatch.setattr(GatewayServer, "run", run)
    monkeypatch.setenv("MICROSCHEDULER_SERVER__MAX_HEADER_BYTES", "32768")
    monkeypatch.setenv("MICROSCHEDULER_SERVER__KEEP_ALIVE_S", "7")
    monkeypatch.setenv("MICROSCHEDULER_SERVER__MAX_CONNECTIONS", "123")
    monkeypatch.setenv("MICROSCHEDULER_STATE_DIR", str(tmp_path / "var"))
    args = argparse.Namespace(
        config=config(tmp_path), host=None, port=0, watch_config=False, banner=False
    )
    run_serve(args)
    (server,) = seen
    options = server.config
    assert options.timeout_keep_alive == 7
    assert options.backlog == 65535
    assert options.limit_concurrency is None  # the protocol's eviction replaces it
    protocol = options.http
    assert isinstance(protocol, type)
    assert issubclass(protocol, GatewayProtocol)
    assert protocol.limits.max_header_bytes == 32768
    assert protocol.slots.cap == 123
    assert server._slots is protocol.slots  # the listener pauses for this cap


def test_raw_response_is_a_closing_openai_error() -> None:
    raw = raw_response(RequestHeadersTooLarge("too big"))
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"connection: close" in head
    assert f"content-length: {len(body)}".encode() in head
    assert body.startswith(b'{"error": {"message": "too big"')


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b'{"t": NaN}', "NaN"),
        (b'{"t": Infinity}', "Infinity"),
        (b'{"t": -Infinity}', "-Infinity"),
        (b'{"t": 1e999}', "1e999"),
        (b'{"t": -1E+400}', "-1E+400"),
        (b'{"t": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"t": "\xff"}', "not UTF-8"),
        (b'{"t": ' + b"1" * 5000 + b"}", "too long"),
    ],
)
def test_json_object_refuses_what_openai_refuses(body: bytes, names: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        json_object(body)
    assert info.value.code == ErrorCode.INVALID_JSON
    assert names in info.value.message


def test_json_object_keeps_ordinary_numbers() -> None:
    assert json_object(b'{"a": 0.7, "b": 1e-3, "c": 1.5E+2, "d": -0.0, "e": 12}') == {
        "a": 0.7,
        "b": 0.001,
        "c": 150.0,
        "d": -0.0,
        "e": 12,
    }
