"""The fake Anthropic Messages API: Anthropic's shapes, validation, event order, faults."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.sim.anthropic import FakeAnthropicConfig, FakeAnthropicServer

KEY = "sk-ant-fake"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
BODY = {"model": "claude-x", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def api() -> AsyncIterator[tuple[httpx.AsyncClient, FakeAnthropicServer]]:
    server = FakeAnthropicServer(FakeAnthropicConfig(api_key=KEY, max_input_tokens=50))
    # The client is built once the server is up (its URL is known then).
    async with server, httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        yield client, server


def sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def test_a_message_in_anthropics_shape(
    api: tuple[httpx.AsyncClient, FakeAnthropicServer],
) -> None:
    client, _ = api
    response = await client.post("/v1/messages", json=BODY, headers=HEADERS)
    assert response.status_code == 200
    message = response.json()
    assert message["type"] == "message"
    assert message["id"].startswith("msg_")
    assert message["content"] == [{"type": "text", "text": "Hello from the fake Anthropic API."}]
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["output_tokens"] == 7


async def test_the_documented_event_sequence(
    api: tuple[httpx.AsyncClient, FakeAnthropicServer],
) -> None:
    client, _ = api
    response = await client.post("/v1/messages", json={**BODY, "stream": True}, headers=HEADERS)
    assert response.headers["content-type"].startswith("text/event-stream")
    names = [name for name, _ in sse(response.text)]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 7,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    events = dict(sse(response.text))
    assert events["message_delta"]["delta"]["stop_reason"] == "end_turn"
    assert events["message_delta"]["usage"] == {"output_tokens": 7}


@pytest.mark.parametrize(
    ("headers", "body", "status", "error_type", "fragment"),
    [
        ({"anthropic-version": "2023-06-01"}, BODY, 401, "authentication_error", "x-api-key"),
        ({**HEADERS, "x-api-key": "wrong"}, BODY, 401, "authentication_error", "x-api-key"),
        ({"x-api-key": KEY}, BODY, 400, "invalid_request_error", "anthropic-version"),
        (HEADERS, {**BODY, "max_tokens": None}, 400, "invalid_request_error", "max_tokens"),
        (HEADERS, {**BODY, "temperature": 1.5}, 400, "invalid_request_error", "temperature"),
        (
            HEADERS,
            {**BODY, "messages": [{"role": "system", "content": "x"}]},
            400,
            "invalid_request_error",
            "role",
        ),
        (
            HEADERS,
            {**BODY, "messages": [{"role": "user", "content": "word " * 100}]},
            400,
            "invalid_request_error",
            "prompt is too long",
        ),
        (
            HEADERS,
            {
                **BODY,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}
                        ],
                    }
                ],
            },
            400,
            "invalid_request_error",
            "tool_use_id",
        ),
    ],
)
async def test_requests_are_validated_like_anthropic(
    api: tuple[httpx.AsyncClient, FakeAnthropicServer],
    headers: dict[str, str],
    body: dict[str, Any],
    status: int,
    error_type: str,
    fragment: str,
) -> None:
    client, _ = api
    response = await client.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == status
    payload = response.json()
    assert payload["type"] == "error"
    assert payload["error"]["type"] == error_type
    assert fragment in payload["error"]["message"]


async def test_faults_fail_and_are_counted_and_the_key_is_never_recorded(
    api: tuple[httpx.AsyncClient, FakeAnthropicServer],
) -> None:
    client, _ = api
    patch = {"fail_status": 529, "fail_count": 1, "retry_after": "4"}
    assert (await client.post("/_fake/faults", json=patch)).status_code == 200
    failed = await client.post("/v1/messages", json=BODY, headers=HEADERS)
    assert failed.status_code == 529
    assert failed.headers["retry-after"] == "4"
    assert failed.json()["error"]["type"] == "overloaded_error"
    assert (await client.post("/v1/messages", json=BODY, headers=HEADERS)).status_code == 200
    await client.post("/_fake/faults", json={"stream_error_after": 1})
    stream = await client.post("/v1/messages", json={**BODY, "stream": True}, headers=HEADERS)
    assert [name for name, _ in sse(stream.text)] == ["message_start", "error"]
    stats = (await client.get("/_fake/stats")).json()
    assert (stats["received"], stats["failed"]) == (3, 1)
    assert KEY not in json.dumps(stats)
    assert stats["requests"][0]["key_ok"] is True
    bad = await client.post("/_fake/faults", json={"nope": 1})
    assert bad.status_code == 400
