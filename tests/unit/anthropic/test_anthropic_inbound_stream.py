"""OpenAI chunk streams served as Anthropic Messages streams, and the `as_messages` wrapper."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from app.anthropic import (
    MessagesStreamTranslator,
    SseParser,
    error_event,
    ping_event,
)
from app.errors import UpstreamTimeout, UpstreamUnavailable
from app.upstreams.anthropic.inbound_relay import MessagesStream, as_messages
from app.upstreams.http import BufferedResponse
from app.upstreams.usage import usage_in_tail

Json = dict[str, Any]

EVENTS: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)


def chunk(delta: Json | None = None, finish: str | None = None, **choice: Any) -> str:
    choices = [{"index": 0, "delta": delta or {}, "finish_reason": finish, **choice}]
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": choices})


def usage_chunk(prompt: int = 12, completion: int = 5) -> str:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return json.dumps({"id": "chatcmpl-1", "choices": [], "usage": usage})


def call(index: int, arguments: str, id: str | None = None, name: str | None = None) -> Json:
    entry: Json = {"index": index, "function": {"arguments": arguments}}
    if id is not None:
        entry["id"] = id
        entry["type"] = "function"
        entry["function"]["name"] = name
    return entry


TEXT_STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning_content": "thinking..."}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk({}, "stop"),
    usage_chunk(),
    "[DONE]",
]
TOOL_STREAM = [
    chunk({"role": "assistant", "content": "Checking."}),
    chunk({"tool_calls": [call(0, "", "call_a", "weather")]}),
    chunk({"tool_calls": [call(0, '{"city":')]}),
    chunk({"tool_calls": [call(0, '"Paris"}')]}),
    chunk({"tool_calls": [call(1, '{"city":"Rome"}', "call_b", "weather")]}),
    chunk({}, "tool_calls"),
    usage_chunk(30, 20),
    "[DONE]",
]


def events(raw: list[bytes] | bytes) -> list[Json]:
    """Parse Anthropic SSE bytes; the event name must match the payload's type."""
    parsed: list[Json] = []
    for name, data in SseParser().feed(b"".join(raw) if isinstance(raw, list) else raw):
        payload = json.loads(data)
        assert payload["type"] == name
        parsed.append(payload)
    return parsed


def translate(datas: list[str], *, finish: bool = True) -> tuple[list[Json], Any]:
    translator = MessagesStreamTranslator("claude-x", "msg_1")
    out: list[bytes] = []
    for data in datas:
        out.extend(translator.feed(data))
    if finish:
        out.extend(translator.finish())
    return events(out), translator


def accumulate(evts: list[Json]) -> anthropic.types.Message:
    """Run the events through the SDK's own accumulator; validate the result."""
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in evts:
        assert event["type"] != "error"
        if event["type"] == "ping":
            continue
        typed = EVENTS.validate_python(event)  # validated against the SDK's event types
        snapshot = accumulate_event(event=typed, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    return anthropic.types.Message.model_validate(snapshot.to_dict())


def test_text_stream() -> None:
    evts, translator = translate(TEXT_STREAM)
    assert [e["type"] for e in evts] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert evts[0]["message"] == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    assert evts[1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert evts[2]["delta"] == {"type": "text_delta", "text": "Hel"}
    assert evts[5] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 5, "input_tokens": 12},
    }
    assert translator.done
    assert not translator.failed
    assert translator.usage == {"input_tokens": 12, "output_tokens": 5}
    message = accumulate(evts)
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello"
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 5
    assert translator.feed(chunk({"content": "late"})) == []
    assert translator.finish() == []


def test_tool_stream() -> None:
    evts, _ = translate(TOOL_STREAM)
    starts = [e for e in evts if e["type"] == "content_block_start"]
    assert [s["content_block"] for s in starts] == [
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": "call_a", "name": "weather", "input": {}},
        {"type": "tool_use", "id": "call_b", "name": "weather", "input": {}},
    ]
    stops = [e["index"] for e in evts if e["type"] == "content_block_stop"]
    assert stops == [0, 1, 2]
    message = accumulate(evts)
    assert [block.type for block in message.content] == ["text", "tool_use", "tool_use"]
    assert message.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]
    assert message.content[2].input == {"city": "Rome"}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    assert message.usage.input_tokens == 30


def test_repeated_tool_call_id_keeps_one_block() -> None:
    evts, _ = translate(
        [
            chunk({"tool_calls": [call(0, '{"a":', "call_a", "f")]}),
            chunk({"tool_calls": [{**call(0, "1}"), "id": "call_a"}]}),
            chunk({}, "tool_calls"),
            "[DONE]",
        ]
    )
    assert sum(e["type"] == "content_block_start" for e in evts) == 1
    assert accumulate(evts).content[0].input == {"a": 1}  # type: ignore[union-attr]


def test_stop_sequence_stream() -> None:
    evts, _ = translate(
        [chunk({"content": "a"}), chunk({}, "stop", stop_reason="END"), usage_chunk(), "[DONE]"]
    )
    delta = next(e for e in evts if e["type"] == "message_delta")
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    message = accumulate(evts)
    assert message.stop_sequence == "END"


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_tokens"), ("content_filter", "refusal")]
)
def test_stream_stop_reasons(finish: str, reason: str) -> None:
    evts, _ = translate([chunk({"content": "a"}, finish), "[DONE]"])
    assert accumulate(evts).stop_reason == reason


def test_early_end_is_an_error_not_a_stop_reason() -> None:
    evts, translator = translate(TEXT_STREAM[:4])
    assert evts[-1] == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "The upstream stream ended before the message was complete.",
        },
    }
    assert not any(e["type"] in ("message_delta", "message_stop") for e in evts)
    assert translator.done
    assert translator.failed
    anthropic.types.ErrorResponse.model_validate(evts[-1])


def test_done_without_finish_reason_is_an_error() -> None:
    evts, translator = translate([chunk({"content": "a"}), "[DONE]"], finish=False)
    assert evts[-1]["type"] == "error"
    assert translator.failed


def test_end_after_finish_without_done_is_complete() -> None:
    evts, translator = translate(TEXT_STREAM[:6])
    assert [e["type"] for e in evts[-2:]] == ["message_delta", "message_stop"]
    assert not translator.failed
    accumulate(evts)


@pytest.mark.parametrize(
    ("data", "kind", "message"),
    [
        (
            {"error": {"message": "boom", "type": "server_error", "code": None}},
            "api_error",
            "boom",
        ),
        (
            {"object": "error", "message": "too long", "type": "BadRequestError", "code": 400},
            "invalid_request_error",
            "too long",
        ),
    ],
)
def test_in_band_error(data: Json, kind: str, message: str) -> None:
    evts, translator = translate([chunk({"content": "a"}), json.dumps(data), "[DONE]"])
    assert evts[-1] == {"type": "error", "error": {"type": kind, "message": message}}
    assert translator.done
    assert translator.failed
    assert [e["type"] for e in evts].count("error") == 1


def test_malformed_chunk_is_an_error() -> None:
    evts, translator = translate(["{not json"])
    assert [e["type"] for e in evts] == ["error"]
    assert translator.failed


def test_ping_and_error_events() -> None:
    assert ping_event() == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert events(error_event(529, "busy")) == [
        {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    ]


# --- as_messages -----------------------------------------------------------------------


class FakeResponse:
    """A Relayable over fixed chunks; the first is `first_chunk`."""

    def __init__(
        self,
        chunks: list[bytes],
        *,
        status: int = 200,
        content_type: bytes = b"text/event-stream",
        headers: list[tuple[bytes, bytes]] | None = None,
        stall: bool = False,
    ) -> None:
        self.status = status
        self.headers = [(b"content-type", content_type), *(headers or [])]
        self.first_chunk = chunks[0] if chunks else b""
        self._rest = chunks[1:]
        self._stall = stall
        self.is_event_stream = content_type.startswith(b"text/event-stream")
        self.released = 0

    @property
    def complete(self) -> bool:
        return not self._rest and not self._stall

    async def rest(self) -> AsyncIterator[bytes]:
        for part in self._rest:
            yield part
        if self._stall:
            await asyncio.sleep(10)

    def release(self) -> None:
        self.released += 1


def openai_body(datas: list[str]) -> bytes:
    return b"".join(f"data: {d}\n\n".encode() for d in datas)


def split(raw: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(raw)]
    return [raw[a:b] for a, b in itertools.pairwise(bounds) if b > a]


async def relay(response: FakeResponse) -> tuple[MessagesStream, bytes]:
    out = await as_messages(response, model="claude-x", stream=True, within_s=1.0)
    assert isinstance(out, MessagesStream)
    parts = [out.first_chunk]
    if not out.complete:
        parts.extend([part async for part in out.rest()])
    out.release()
    return out, b"".join(parts)


def without_ids(evts: list[Json]) -> list[Json]:
    for event in evts:
        if event["type"] == "message_start":
            event["message"]["id"] = "msg"
    return evts


@pytest.mark.parametrize("stream", [TEXT_STREAM, TOOL_STREAM])
async def test_stream_split_anywhere_gives_the_same_events(stream: list[str]) -> None:
    raw = openai_body(stream).replace(b"\n\n", b"\r\n\r\n", 2)
    _, whole = await relay(FakeResponse([raw]))
    expected = without_ids(events(whole))
    assert expected[-1]["type"] == "message_stop"
    step = max(1, len(raw) // 40)
    for offset in range(7):
        cuts = list(range(offset + 1, len(raw), step))
        response = FakeResponse(split(raw, cuts))
        out, got = await relay(response)
        assert without_ids(events(got)) == expected
        assert out.complete
        assert not out.failed
        assert response.released == 1
    for size in (1, 3):
        out, got = await relay(FakeResponse(split(raw, list(range(size, len(raw), size)))))
        assert without_ids(events(got)) == expected
    accumulate(expected)


async def test_stream_headers_and_usage() -> None:
    out, got = await relay(FakeResponse(split(openai_body(TEXT_STREAM), [10, 200])))
    assert out.status == 200
    assert out.headers == [(b"content-type", b"text/event-stream; charset=utf-8")]
    assert out.is_event_stream
    assert usage_in_tail(got) == (12, 5)  # what the exchange counts at the body's end


async def test_stream_cut_short_ends_with_an_error() -> None:
    out, got = await relay(FakeResponse(split(openai_body(TEXT_STREAM[:4]), [5, 50])))
    evts = events(got)
    assert evts[-1]["type"] == "error"
    assert out.failed


async def test_error_answer() -> None:
    body = json.dumps({"object": "error", "message": "no such model", "code": 404}).encode()
    response = FakeResponse(
        [body[:10], body[10:]],
        status=404,
        content_type=b"application/json",
        headers=[(b"retry-after", b"3"), (b"x-other", b"1")],
    )
    out = await as_messages(response, model="m", stream=True, within_s=1.0)
    assert isinstance(out, BufferedResponse)
    assert out.status == 404
    assert json.loads(out.first_chunk) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "no such model"},
    }
    assert (b"retry-after", b"3") in out.headers
    assert (b"x-other", b"1") not in out.headers
    assert out.policy_body == body
    assert response.released == 1


async def test_whole_answer() -> None:
    completion = {
        "id": "chatcmpl-9",
        "choices": [{"index": 0, "message": {"content": "Hi"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    raw = json.dumps(completion).encode()
    response = FakeResponse([raw[:7], raw[7:]], content_type=b"application/json")
    out = await as_messages(response, model="claude-x", stream=False, within_s=1.0)
    assert isinstance(out, BufferedResponse)
    message = anthropic.types.Message.model_validate_json(out.first_chunk)
    assert message.id == "msg_chatcmpl-9"
    assert message.model == "claude-x"
    assert message.stop_reason == "max_tokens"
    assert response.released == 1


async def test_whole_answer_that_is_not_json() -> None:
    response = FakeResponse([b"<html>"], content_type=b"text/html")
    with pytest.raises(UpstreamUnavailable) as caught:
        await as_messages(response, model="m", stream=False, within_s=1.0)
    assert caught.value.kind == "bad_response"
    assert response.released == 1


async def test_whole_answer_too_slow() -> None:
    response = FakeResponse([b"{"], content_type=b"application/json", stall=True)
    with pytest.raises(UpstreamTimeout):
        await as_messages(response, model="m", stream=False, within_s=0.01)
    assert response.released == 1
