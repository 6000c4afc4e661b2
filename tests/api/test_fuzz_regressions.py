"""Bugs the fuzzer found, one test each: client text the gateway quotes in an error (or a
log line) must render whatever it holds, lone surrogates included."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import pytest

from app.errors import ModelNotFound, safe_text
from app.jsonwire import json_bytes
from app.upstreams.provider import ProviderRequest
from tests.fakes.servers import Gateway, fake_vllm, gateway, gateway_settings

LONE = b'"\\udcff"'  # the JSON escape of a lone surrogate, as raw body bytes


@pytest.fixture
async def gw() -> AsyncIterator[Gateway]:
    settings = gateway_settings({"m": {"url": "http://127.0.0.1:9", "models": ["m"]}})
    async with gateway(settings) as gw:
        yield gw


async def test_an_unknown_model_named_with_a_lone_surrogate_is_a_404(gw: Gateway) -> None:
    body = b'{"model": ' + LONE + b', "messages": []}'
    response = await gw.client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found"
    assert "\\udcff" in error["message"]


async def test_the_messages_api_says_it_in_anthropics_envelope(gw: Gateway) -> None:
    body = b'{"model": ' + LONE + b', "max_tokens": 1, "messages": []}'
    response = await gw.client.post(
        "/v1/messages", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 404
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "not_found_error"


async def test_a_lone_surrogate_in_a_key_named_by_an_error_renders(gw: Gateway) -> None:
    body = b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],'
    body += b' "top_k": "\\ud800"}'
    response = await gw.client.post(
        "/v1/messages", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code in (400, 503)
    assert response.json()["type"] == "error"


def test_safe_text_escapes_only_what_cannot_be_encoded() -> None:
    assert safe_text("caf\u00e9 \U0001f600") == "caf\u00e9 \U0001f600"
    assert safe_text("a\udcffb") == "a\\udcffb"
    assert "\\ud800" in ModelNotFound("\ud800").message
    ModelNotFound("\ud800").message.encode()


def test_a_log_line_quoting_a_lone_surrogate_is_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from app.logs import SafeFormatter

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "model=%s", ("\udcff",), None)
    SafeFormatter("%(message)s").format(record).encode()


async def test_a_lone_surrogate_in_a_body_whose_alias_is_rewritten_reaches_the_backend() -> None:
    """The body is re-serialized to put the model's real name in; it was a 500. (The fake's
    own `/_fake/stats` cannot encode such a body either, so only the answer is checked.)"""
    async with fake_vllm(models=["served-model"], max_tokens=2) as upstream:
        settings = gateway_settings(
            {"m": {"url": upstream.url, "models": ["served-model"], "aliases": ["alias"]}}
        )
        async with gateway(settings) as gw:
            chat = b'{"model": "alias", "messages": [{"role": "user", "content": "hi"}], "user": '
            chat += LONE + b"}"
            response = await gw.client.post(
                "/v1/chat/completions", content=chat, headers={"content-type": "application/json"}
            )
            assert response.status_code == 200, response.text
            anthropic = b'{"model": "alias", "max_tokens": 2, "messages": [{"role": "user", '
            anthropic += b'"content": "hi"}], "stop_sequences": [' + LONE + b"]}"
            response = await gw.client.post(
                "/v1/messages", content=anthropic, headers={"content-type": "application/json"}
            )
            assert response.status_code == 200, response.text


def test_json_bytes_writes_a_lone_surrogate_as_the_client_did() -> None:
    assert json_bytes({"a": "\u00e9"}) == '{"a":"\u00e9"}'.encode()
    assert json_bytes({"a": "\udcff"}) == b'{"a":"\\udcff"}'
    assert json.loads(json_bytes({"a": "\udcff"})) == {"a": "\udcff"}


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/messages", "/v1/embeddings", "/vram/yield"]
)
async def test_a_body_nested_too_deeply_is_a_400(gw: Gateway, path: str) -> None:
    """`json.loads` raises RecursionError about a thousand levels down; it was a 500."""
    body = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = await gw.client.post(path, content=body)
    assert response.status_code == 400, response.text
    if path.startswith("/v1/messages"):
        assert response.json()["error"]["type"] == "invalid_request_error"
    else:
        assert response.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/vram/yield"])
async def test_an_integer_of_thousands_of_digits_is_a_400(gw: Gateway, path: str) -> None:
    """Python refuses to parse an integer of over 4300 digits (a ValueError that is not a
    JSONDecodeError); it was a 500."""
    body = b'{"model": "m", "max_tokens": 1' + b"0" * 5000 + b"}"
    response = await gw.client.post(path, content=body)
    assert response.status_code == 400, response.text


def test_a_chain_entry_gets_a_body_with_a_lone_surrogate_as_the_client_wrote_it() -> None:
    request = ProviderRequest("/v1/chat/completions", {"model": "a", "user": "\udcff"}, False)
    assert request.body_for("cloud-model") == b'{"model":"cloud-model","user":"\\udcff"}'
