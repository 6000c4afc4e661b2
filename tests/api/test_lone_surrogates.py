"""A lone surrogate (`"\\ud800"`, valid JSON, a `str` UTF-8 cannot encode once decoded) on
the Anthropic paths: the Messages API translated to a vLLM that echoes the prompt, and an
OpenAI chat request through an Anthropic provider in a fallback chain, both ways. Every
answer is an enveloped response or a completed stream, with the escape kept as the client
wrote it (`app.jsonwire`). These were a plain 500, or a stream cut after `message_start`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from app.jsonwire import json_bytes, sse_data, sse_event
from app.sim.anthropic import FakeAnthropicServer
from tests.fakes.provider import cloud_settings, fake_anthropic
from tests.fakes.servers import Gateway, fake_vllm, gateway, gateway_settings

JSON = {"content-type": "application/json"}
LONE = "\\ud800"  # as the client writes it: a JSON escape
KEY = "sk-ant-test-0123456789"


def messages_body(*, stream: bool) -> bytes:
    return (
        b'{"model": "m", "max_tokens": 5, "stream": ' + (b"true" if stream else b"false") + b", "
        b'"messages": [{"role": "user", "content": "\\ud800"}]}'
    )


def chat_body(*, stream: bool, content: str = LONE) -> bytes:
    return (
        b'{"model": "reasoning", "stream": ' + (b"true" if stream else b"false") + b", "
        b'"messages": [{"role": "user", "content": "' + content.encode() + b'"}]}'
    )


def events(text: str) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) of each SSE event."""
    out: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                raw = line[len("data: ") :]
                data = raw if raw == "[DONE]" else json.loads(raw)
        if name is not None or data is not None:
            out.append((name, data))
    return out


@pytest.fixture
async def echo_gw() -> AsyncIterator[Gateway]:
    """The gateway before a fake vLLM that writes the prompt back (the surrogate too)."""
    async with fake_vllm(models=["m"], max_tokens=5) as upstream:
        settings = gateway_settings({"m": {"url": upstream.url, "models": ["m"]}})
        async with gateway(settings) as gw:
            yield gw


async def test_a_messages_answer_echoing_a_lone_surrogate_is_written(echo_gw: Gateway) -> None:
    response = await echo_gw.client.post("/v1/messages", content=messages_body(stream=False),
                                         headers=JSON)  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"]
    assert b"\\ud800" in response.content  # the escape, as the client sent it
    message = response.json()
    assert message["type"] == "message"
    assert "\ud800" in message["content"][0]["text"]


async def test_a_messages_stream_echoing_a_lone_surrogate_completes(echo_gw: Gateway) -> None:
    response = await echo_gw.client.post("/v1/messages", content=messages_body(stream=True),
                                         headers=JSON)  # fmt: skip
    assert response.status_code == 200
    assert response.headers["x-request-id"]
    names = [name for name, _ in events(response.text)]
    assert names[0] == "message_start"
    assert names[-1] == "message_stop"
    assert "error" not in names
    text = "".join(
        data["delta"]["text"] for name, data in events(response.text)
        if name == "content_block_delta"
    )  # fmt: skip
    assert "\ud800" in text


@asynccontextmanager
async def chain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **faults: Any
) -> AsyncIterator[tuple[Gateway, FakeAnthropicServer]]:
    """`reasoning` answered by the Anthropic provider alone (its local entry unreachable)."""
    monkeypatch.setenv("ANTHROPIC_TEST_KEY", KEY)
    async with fake_anthropic(KEY, **faults) as claude:
        settings = cloud_settings(
            {"reasoning": {"url": "http://127.0.0.1:9", "models": ["local-model"],
                           "aliases": ["reasoning"], "role": "reasoning"}},
            {"claude": {"kind": "anthropic", "base_url": claude.url,
                        "api_key_env": "ANTHROPIC_TEST_KEY", "model": "claude-sonnet-4-5",
                        "max_tokens": 64}},
            {"reasoning": {"entries": ["claude"]}},
            state_dir=tmp_path / "var",
        )  # fmt: skip
        async with gateway(settings) as gw:
            yield gw, claude


@pytest.mark.parametrize("stream", [False, True])
async def test_a_lone_surrogate_reaches_the_anthropic_provider(
    stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The request translated for Anthropic holds it (it was a 500 before anything was sent)."""
    async with chain(monkeypatch, tmp_path) as (gw, claude):
        response = await gw.client.post("/v1/chat/completions", content=chat_body(stream=stream),
                                        headers=JSON)  # fmt: skip
        assert response.status_code == 200, response.text
        assert response.headers["x-request-id"]
        assert response.headers["x-microscheduler-route"] == "claude"
        assert claude.fake.requests[-1]["body"]["messages"][0]["content"] == "\ud800"
        if stream:
            assert response.text.rstrip().endswith("data: [DONE]")
            assert all("error" not in data for _, data in events(response.text)[:-1])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_lone_surrogate_from_the_anthropic_provider_is_written(
    stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Claude's answer holds one (as an escape): translated to OpenAI's shape, it is kept."""
    async with chain(monkeypatch, tmp_path, text=["a", "\ud800", "b"]) as (gw, _):
        response = await gw.client.post("/v1/chat/completions",
                                        content=chat_body(stream=stream, content="hi"),
                                        headers=JSON)  # fmt: skip
        assert response.status_code == 200, response.text
        assert response.headers["x-request-id"]
        assert b"\\ud800" in response.content
        if stream:
            chunks = [data for _, data in events(response.text)]
            assert chunks[-1] == "[DONE]"
            text = "".join(c["choices"][0]["delta"].get("content") or ""
                           for c in chunks[:-1] if c["choices"])  # fmt: skip
        else:
            text = response.json()["choices"][0]["message"]["content"]
        assert text == "a\ud800b"


def test_the_encoder_keeps_utf8_and_escapes_only_a_document_with_a_lone_surrogate() -> None:
    assert json_bytes({"a": "\u00e9"}) == '{"a":"\u00e9"}'.encode()
    assert json_bytes({"a": "\u00e9\ud800"}) == b'{"a":"\\u00e9\\ud800"}'
    assert json.loads(json_bytes({"a": "\ud800"})) == {"a": "\ud800"}
    assert sse_data({"a": "\ud800"}) == b'data: {"a":"\\ud800"}\n\n'
    assert sse_event("ping", {"a": "\ud800"}) == b'event: ping\ndata: {"a":"\\ud800"}\n\n'
