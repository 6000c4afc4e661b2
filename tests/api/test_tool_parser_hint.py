"""A local vLLM started without `--enable-auto-tool-choice --tool-call-parser` refuses every
request with tools 400 (Claude Code's every request): the gateway relays vLLM's status,
envelope and words with a hint naming the flags appended, on chat and on `/v1/messages`
(passed through, or translated to chat), stream or not, and logs it once per backend.
Against the fake vLLM, which refuses as vLLM 0.33 does (app.sim.tools)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.api.test_lifecycle_api import lazy, lifecycle_gateway
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeVllmRuntime,
    Gateway,
    fake_vllm,
    gateway,
    gateway_settings,
    until_backend,
)

REFUSED = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
HINT = (
    " (microscheduler: start the vLLM of backend 'local' with --enable-auto-tool-choice "
    "--tool-call-parser PARSER, e.g. hermes for Qwen, llama3_json for Llama 3; see "
    "docs/vllm.md#claude-code)"
)
HI: Any = [{"role": "user", "content": "hello"}]
CHAT_TOOL: Any = {"type": "function", "function": {"name": "Read", "parameters": {}}}
TOOL: Any = {"name": "Read", "input_schema": {"type": "object"}}


@asynccontextmanager
async def world(**backend: Any) -> AsyncIterator[Gateway]:
    """`qwen` on a generate backend whose vLLM runs without the tool flags."""
    async with fake_vllm(models=["qwen"], task="generate", max_tokens=4) as fake:
        settings = gateway_settings({"local": {"url": fake.url, "models": ["qwen"], **backend}})
        async with gateway(settings) as gw:
            yield gw


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_keeps_vllms_400_and_gets_the_hint(stream: bool) -> None:
    async with world() as gw:
        body = {"model": "qwen", "messages": HI, "tools": [CHAT_TOOL], "stream": stream}
        answer = await gw.client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/json"
    assert int(answer.headers["content-length"]) == len(answer.content)
    assert answer.json() == {
        "error": {"message": REFUSED + HINT, "type": "BadRequestError", "param": None,
                  "code": 400}
    }  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("messages", ["native", "translate"])
async def test_messages_keep_the_400_in_anthropics_envelope_with_the_hint(
    stream: bool, messages: str
) -> None:
    """Passed through, vLLM's Messages route answers in Anthropic's envelope; translated,
    the chat route's answer is put in it: either way the hint is appended."""
    async with world(messages=messages) as gw:
        body = {"model": "qwen", "max_tokens": 8, "messages": HI, "tools": [TOOL],
                "stream": stream}  # fmt: skip
        answer = await gw.client.post("/v1/messages", json=body)
    assert answer.status_code == 400
    assert answer.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": REFUSED + HINT},
    }


async def test_a_stream_held_by_wake_notices_gets_the_hint_in_band(tmp_path: Path) -> None:
    """A streaming client held while its backend wakes has its status line (200) already:
    the 400 comes as the stream's one error event, hinted the same."""
    port = free_port()
    runtime = FakeVllmRuntime(port, open_at_start=False, models=["lazy-model"])
    async with lifecycle_gateway(
        {"local": lazy(port)}, {"local": runtime}, tmp_path, wake_notice_s=0.1
    ) as gw:
        body = {"model": "lazy-model", "messages": HI, "tools": [CHAT_TOOL], "stream": True}
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=body))
        await until_backend(gw, "local", waiting=1)
        await asyncio.sleep(0.25)  # wake notices go out: the status line is sent already
        runtime.listening.set()
        answer = await request
    assert answer.status_code == 200
    events = [b for b in answer.text.split("\n\n") if b.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["message"] == REFUSED + HINT
    assert error["code"] == 400


async def test_a_named_tool_choice_is_hinted_too() -> None:
    async with world() as gw:
        body = {"model": "qwen", "messages": HI, "tools": [CHAT_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "Read"}}}  # fmt: skip
        answer = await gw.client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        'tool_choice=function "Read" requires --tool-call-parser to be set' + HINT
    )


async def test_logged_once_per_backend(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="app.routing.dispatcher")
    async with world() as gw:
        body = {"model": "qwen", "messages": HI, "tools": [CHAT_TOOL]}
        for _ in range(3):
            answer = await gw.client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 400
    logged = [r.getMessage() for r in caplog.records if "without tool calling" in r.getMessage()]
    assert logged == [
        "backend refused a request with tools: its vLLM runs without tool calling "
        "backend=local hint=" + HINT.strip(" ()")
    ]


async def test_another_400_is_relayed_byte_for_byte() -> None:
    async with world(lower_max_tokens=False) as gw:
        body = {"model": "qwen", "messages": HI, "max_tokens": 100_000}
        answer = await gw.client.post("/v1/chat/completions", json=body)
        direct = json.loads(answer.content)
    assert answer.status_code == 400
    assert direct["error"]["message"].startswith("max_tokens=100000 cannot be greater than")
    assert "microscheduler" not in answer.text
    assert answer.content == (
        b'{"error":{"message":"max_tokens=100000 cannot be greater than max_model_len=8192. '
        b'Please request fewer output tokens. (parameter=max_tokens, value=100000)",'
        b'"type":"BadRequestError","param":"max_tokens","code":400}}'
    )
