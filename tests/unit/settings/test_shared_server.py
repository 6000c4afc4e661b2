"""Two backends on one server (`app.settings.urls`): one `host:port` is one server, so a
backend the gateway runs may not share its address with another backend, and two external
backends may share one only to send it different models. `check-config` refuses it,
naming both backends and the address, and so does `serve` (the same validation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from app.cli import main
from app.settings import Settings
from app.settings.urls import LOOPBACK, server_address

PROCESS = {"kind": "process", "command": ["vllm", "serve", "m"]}


def managed(url: str, model: str, **fields: Any) -> dict[str, Any]:
    return {"url": url, "models": [model], "runtime": PROCESS, **fields}


def external(url: str, model: str, **fields: Any) -> dict[str, Any]:
    return {"url": url, "models": [model], **fields}


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://localhost:8000", (LOOPBACK, 8000)),
        ("http://127.0.0.1:8000/", (LOOPBACK, 8000)),
        ("http://127.0.0.2:8000", (LOOPBACK, 8000)),
        ("http://[::1]:8000", (LOOPBACK, 8000)),
        ("http://0.0.0.0:8000", (LOOPBACK, 8000)),
        ("https://localhost:8000/vllm", (LOOPBACK, 8000)),
        ("http://VLLM-A:8000", ("vllm-a", 8000)),
        ("http://vllm-a", ("vllm-a", 80)),
        ("https://vllm-a", ("vllm-a", 443)),
    ],
)
def test_a_url_names_its_server_by_host_and_port(url: str, address: tuple[str, int]) -> None:
    assert server_address(url) == address


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("http://127.0.0.1:8000", "http://localhost:8000/"),
        ("http://vllm-a:8000", "http://vllm-a:8000"),
        ("http://vllm-a:8000/one", "http://vllm-a:8000/two"),  # one port, one server
        ("http://vllm-a:8000", "https://vllm-a:8000"),
        ("http://vllm-a", "http://vllm-a:80"),
    ],
)
def test_two_managed_backends_on_one_server_are_refused(first: str, second: str) -> None:
    backends = {"chat": managed(first, "chat-model"), "embed": managed(second, "embed-model")}
    with pytest.raises(ValidationError) as refused:
        Settings(backends=backends)
    message = str(refused.value)
    assert f"backends.embed.url: {second.rstrip('/')}" in message
    assert "is the server of backend 'chat' too" in message
    assert "Give each backend its own port" in message


def test_a_managed_backend_on_an_external_ones_server_is_refused() -> None:
    backends = {
        "outside": external("http://127.0.0.1:8000", "outside-model"),
        "lazy": managed("http://localhost:8000", "lazy-model", lifecycle="lazy", vram_mib=1000),
    }
    with pytest.raises(ValidationError) as refused:
        Settings(backends=backends)
    message = str(refused.value)
    assert "backends.lazy.url: http://localhost:8000 (= http://127.0.0.1:8000)" in message
    assert "the gateway runs 'lazy' there itself" in message


def test_external_backends_may_share_a_server_for_different_models() -> None:
    # A server that serves several models (a router, an OpenAI-compatible server): each
    # backend is one of its models.
    backends = {
        "llama": external("http://models:8080", "llama"),
        "qwen": external("http://models:8080", "qwen"),
    }
    assert set(Settings(backends=backends).backends) == {"llama", "qwen"}


def test_external_replicas_on_one_server_are_one_model_twice() -> None:
    member = {"replica_of": "pool"}
    backends = {
        "a": external("http://127.0.0.1:8000", "m", **member),
        "b": external("http://localhost:8000", "m", **member),
    }
    with pytest.raises(
        ValidationError, match="and both send model 'm': one model configured twice"
    ):
        Settings(backends=backends)


def test_other_ports_and_hosts_are_other_servers() -> None:
    backends = {
        "a": managed("http://127.0.0.1:8000", "a"),
        "b": managed("http://127.0.0.1:8001", "b"),
        "c": managed("http://vllm-c:8000", "c"),
    }
    assert len(Settings(backends=backends).backends) == 3


def test_check_config_refuses_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    backends = {
        "chat": managed("http://127.0.0.1:8000", "chat-model"),
        "embed": managed("http://localhost:8000", "embed-model"),
    }
    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"backends": backends}))
    with pytest.raises(SystemExit) as exited:
        main(["check-config", "--config", str(tmp_path)])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "backends.embed.url: http://localhost:8000 (= http://127.0.0.1:8000)" in err
    assert "backend 'chat'" in err
