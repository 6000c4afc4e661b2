"""`allowed_origins` / `allowed_hosts` (checked and written as browsers write them) and
`OriginPolicy`, the pure decisions `OriginGuard` and the admin check take from them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.access.origins import OriginPolicy, host_name
from app.settings import ConfigError, Settings, load_settings

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


def test_environment_lists_comma_separated_or_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "MICROSCHEDULER_ALLOWED_ORIGINS", "HTTPS://Chat.Example.com:443/, http://localhost:3000"
    )
    monkeypatch.setenv("MICROSCHEDULER_ALLOWED_HOSTS", '["gpu.example", "[fd00:0::1]"]')
    settings = load_settings(config(tmp_path))
    assert settings.allowed_origins == ("https://chat.example.com", "http://localhost:3000")
    assert settings.allowed_hosts == ("gpu.example", "fd00::1")


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("allowed_origins: ['*']", "list each origin"),
        ("allowed_origins: ['null']", "list each origin"),
        ("allowed_origins: [chat.example.com]", "must be an origin"),
        ("allowed_origins: ['ftp://chat.example.com']", "must be an origin"),
        ("allowed_origins: ['https://chat.example.com/app']", "no path"),
        ("allowed_origins: ['https://u:p@chat.example.com']", "user:password"),
        ("allowed_origins: ['http://chat.example.com:99999']", "valid port"),
        ("allowed_hosts: ['gpu.example:8080']", "without scheme or port"),
        ("allowed_hosts: ['https://gpu.example']", "without scheme or port"),
        ("allowed_hosts: ['*', gpu.example]", "alone"),
    ],
)
def test_malformed_entries_are_refused(tmp_path: Path, line: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(config(tmp_path, line + "\n"))
    message = str(info.value)
    assert line.split(":")[0] in message
    assert words in message


def policy(**fields: object) -> OriginPolicy:
    backends = {"b": {"url": "http://127.0.0.1:9", "models": ["m"]}}
    return OriginPolicy.from_settings(Settings(backends=backends, **fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("host", "trusted"),
    [
        ("localhost:8080", True),
        ("127.0.0.1", True),
        ("127.0.0.2:1", True),
        ("[::1]:8080", True),
        ("LOCALHOST.", True),
        ("evil.example", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.evil.example:8080", False),
        ("0x7f000001", False),
        ("gpu.example:443", True),  # allowed_hosts
        ("chat.example", True),  # an allowed origin's host
        ("10.0.0.5:8080", True),  # the listen host
        (None, True),  # no Host: not a browser
    ],
)
def test_trusted_hosts(host: str | None, trusted: bool) -> None:
    chosen = policy(
        host="10.0.0.5",
        allowed_hosts=["gpu.example"],
        allowed_origins=["http://chat.example:3000"],
        allow_unauthenticated=True,
    )
    assert chosen.host_trusted(host) is trusted


def test_star_trusts_every_host() -> None:
    assert policy(allowed_hosts=["*"]).host_trusted("evil.example")


@pytest.mark.parametrize(
    ("origin", "scheme", "host", "same"),
    [
        ("http://127.0.0.1:8080", "http", "127.0.0.1:8080", True),
        ("http://gpu.example", "http", "gpu.example:80", True),
        ("https://gpu.example", "https", "GPU.example", True),
        ("https://gpu.example", "http", "gpu.example", False),
        ("http://127.0.0.1:8081", "http", "127.0.0.1:8080", False),
        ("http://evil.example", "http", "127.0.0.1:8080", False),
        ("null", "http", "127.0.0.1:8080", False),
        ("http://127.0.0.1:8080", "http", None, False),
    ],
)
def test_same_origin(origin: str, scheme: str, host: str | None, same: bool) -> None:
    assert OriginPolicy().same_origin(origin, scheme, host) is same


def test_host_name_drops_port_and_brackets() -> None:
    assert host_name("[0:0::1]:8080") == "::1"
    assert host_name("Gpu.Example:8080") == "gpu.example"
