"""The fake vLLM's tool calling, as vLLM 0.33's: only with `--enable-auto-tool-choice
--tool-call-parser NAME`; without them a request with tools is refused 400 in vLLM's
words, on chat and on the native Messages API (where Claude Code sends every request).
And its `/openapi.json`, slow on the first call as vLLM's."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from app.sim.vllm import FakeConfig, FakeVllmServer, parse_args
from tests.fakes.processes import ROOT

TOOL: Any = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
READ: Any = {"name": "Read", "input_schema": {"type": "object"}}
HELLO: Any = [{"role": "user", "content": "hello"}]
AUTO_TOOL_CHOICE_REFUSED = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)
# vLLM 0.33's body for the refusal (vllm/renderers/online_renderer.py:277, its
# create_error_response: type BadRequestError, code 400).
REFUSED: Any = {
    "error": {"message": AUTO_TOOL_CHOICE_REFUSED, "type": "BadRequestError", "param": None,
              "code": 400}
}  # fmt: skip


@asynccontextmanager
async def fake(**options: Any) -> AsyncIterator[httpx.AsyncClient]:
    config = FakeConfig(port=0, models=["m"], max_tokens=4, **options)
    async with (
        FakeVllmServer(config) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=5) as client,
    ):
        yield client


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": HELLO, "tools": [TOOL], **fields}


def messages(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": HELLO, "tools": [READ], **fields}


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_with_tools_and_no_tool_parser_is_vllms_400(stream: bool) -> None:
    async with fake() as client:
        for body in (chat(stream=stream), chat(stream=stream, tool_choice="auto")):
            answer = await client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 400
            assert answer.headers["content-type"] == "application/json"
            assert answer.json() == REFUSED


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        ({"type": "function", "function": {"name": "get_weather"}},
         'tool_choice=function "get_weather" requires --tool-call-parser to be set'),
    ],
)  # fmt: skip
async def test_a_required_or_named_tool_choice_needs_the_parser_too(
    choice: Any, message: str
) -> None:
    async with fake() as client:
        answer = await client.post("/v1/chat/completions", json=chat(tool_choice=choice))
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == message


async def test_tool_choice_none_is_answered_in_text_without_the_flags() -> None:
    async with fake() as client:
        answer = await client.post("/v1/chat/completions", json=chat(tool_choice="none"))
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"]
        no_tools = await client.post("/v1/chat/completions", json={"model": "m", "messages": HELLO})
        assert no_tools.status_code == 200


async def test_with_the_flags_the_tool_is_called() -> None:
    async with fake(enable_auto_tool_choice=True, tool_call_parser="hermes") as client:
        answer = await client.post("/v1/chat/completions", json=chat())
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        required = await client.post("/v1/chat/completions", json=chat(tool_choice="required"))
        assert required.json()["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_with_tools_and_no_tool_parser_is_vllms_400_in_anthropics_envelope(
    stream: bool,
) -> None:
    """vLLM's Anthropic route renders the same chat request (its `tool_choice` "auto" when
    tools come without one: vllm/entrypoints/anthropic/serving.py:818-819) and answers
    the error through `translate_error_response`; a stream's comes before the stream."""
    error = {"type": "invalid_request_error", "message": AUTO_TOOL_CHOICE_REFUSED}
    expected = {"type": "error", "error": error}
    async with fake() as client:
        for body in (
            messages(stream=stream),
            messages(stream=stream, tool_choice={"type": "auto"}),
        ):
            answer = await client.post("/v1/messages", json=body)
            assert answer.status_code == 400
            assert answer.json() == expected
        counted = await client.post("/v1/messages/count_tokens", json=messages())
        assert (counted.status_code, counted.json()) == (400, expected)


async def test_messages_tool_choices_as_vllm_converts_them() -> None:
    async with fake() as client:
        any_ = await client.post("/v1/messages", json=messages(tool_choice={"type": "any"}))
        assert any_.json()["error"]["message"] == (
            'tool_choice="required" requires --tool-call-parser to be set'
        )
        named = await client.post(
            "/v1/messages", json=messages(tool_choice={"type": "tool", "name": "Read"})
        )
        assert named.json()["error"]["message"] == (
            'tool_choice=function "Read" requires --tool-call-parser to be set'
        )
        none = await client.post("/v1/messages", json=messages(tool_choice={"type": "none"}))
        assert none.status_code == 200
        assert none.json()["content"][0]["type"] == "text"
    async with fake(enable_auto_tool_choice=True, tool_call_parser="hermes") as client:
        called = await client.post("/v1/messages", json=messages())
        assert called.json()["content"][0]["type"] == "tool_use"
        text = await client.post("/v1/messages", json=messages(tool_choice={"type": "none"}))
        assert text.json()["content"][0]["type"] == "text"


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--enable-auto-tool-choice"],
         "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser"),
        (["--enable-auto-tool-choice", "--tool-call-parser", "nope"],
         "KeyError: 'invalid tool call parser: nope (chose from { apertus,"),
    ],
)  # fmt: skip
def test_the_flags_are_checked_at_start_as_vllm_checks_them(flags: list[str], error: str) -> None:
    """vllm/entrypoints/common/cli_args.py:553 and :619: the server does not start."""
    done = subprocess.run(
        [sys.executable, "-m", "app.sim.vllm", "--port", "0", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith(error)


def test_the_flags_parse() -> None:
    config = parse_args(["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"])
    assert (config.enable_auto_tool_choice, config.tool_call_parser) == (True, "llama3_json")
    assert config.tool_calling
    assert not parse_args(["--tool-call-parser", "hermes"]).tool_calling  # vLLM needs both
    assert parse_args([]).openapi_delay == 0.5


async def test_openapi_json_is_slow_on_its_first_call_only() -> None:
    """FastAPI builds vLLM's schema on the first call (measured 0.6 s and more on a real
    server); a call during the build waits for it; later ones answer at once."""
    delay = 0.5
    config = FakeConfig(port=0, models=["m"], openapi_delay=delay)
    async with (
        FakeVllmServer(config) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=5) as client,
    ):
        loop = asyncio.get_running_loop()

        async def timed() -> float:
            began = loop.time()
            answer = await client.get("/openapi.json")
            assert answer.status_code == 200
            return loop.time() - began

        first, during = await asyncio.gather(timed(), timed())
        later = await timed()
    assert first >= delay
    assert during >= delay * 0.9  # began with the first, waited for the same build
    assert later < delay
