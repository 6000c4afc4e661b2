"""Anthropic's streamed Messages events as OpenAI chat-completion chunks. Pure: no I/O.

`SseParser` turns body bytes into `(event, data)` pairs; the caller decodes `data` as
JSON and hands it to `StreamTranslator.feed`, which returns the OpenAI SSE lines to send.
When the upstream body ends, `StreamTranslator.finish` returns the closing lines. `StreamEnd`
(its `done` and `failed`) is shared with the other direction's translator (inbound_stream.py).

Mapping (Anthropic's streaming events, docs.anthropic.com/en/docs/build-with-claude/streaming):

    message_start                 first chunk, delta {"role": "assistant", "content": ""}
    content_block_start tool_use  delta.tool_calls [{index, id, type, function{name, ""}}]
    text_delta                    delta.content
    input_json_delta              delta.tool_calls [{index, function{arguments}}]
    message_delta                 remembered: stop reason, cumulative usage
    message_stop                  chunk with empty delta and finish_reason; then the usage
                                  chunk (choices []) if include_usage; then [DONE]
    error                         data: {"error": {...}} then [DONE]
    ping, content_block_stop,     nothing (keeping an idle client connection open is the
    thinking/signature deltas,    relay's business; reasoning has no field in OpenAI's
    unknown events                chat chunks, so it is dropped)

A tool call's `index` counts tool calls (0, 1, ...), not Anthropic's content blocks. A
stream that ends without `message_stop` (or an `error`) was cut: `finish` then sends an
in-band error with code `upstream_incomplete` and [DONE], never a made-up finish_reason.
After [DONE] the translator ignores everything.
"""

from __future__ import annotations

import re
from typing import Any, Final

from app.anthropic.response import (
    completion_id,
    finish_reason,
    merge_usage,
    openai_error,
    openai_usage,
)
from app.jsonwire import sse_data

Json = dict[str, Any]

DONE: Final = b"data: [DONE]\n\n"
_EOL: Final = re.compile(rb"\r\n|\r|\n")
_BOM: Final = b"\xef\xbb\xbf"


class SseParser:
    """Incremental `text/event-stream` parser (WHATWG HTML, "Server-sent events").

    Accepts any chunking: lines end in LF, CRLF or CR (a CRLF may straddle two chunks),
    multi-byte characters may be split. `data` lines of one event are joined with "\\n";
    comments (`:`), `id` and `retry` are skipped; an event without data is not dispatched.
    The event name defaults to "message". An unterminated event at the end is discarded.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._after_cr = False  # the last chunk ended in CR: a leading LF is its pair
        self._at_start = True
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        if not chunk:
            return []
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        buffer = self._buffer + chunk
        if self._at_start:
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                self._buffer = buffer  # maybe a byte order mark: wait for more
                return []
            self._at_start = False
            buffer = buffer.removeprefix(_BOM)
        events: list[tuple[str, str]] = []
        start = 0
        for match in _EOL.finditer(buffer):
            event = self._line(buffer[start : match.start()])
            start = match.end()
            if event is not None:
                events.append(event)
        self._after_cr = start == len(buffer) and buffer.endswith(b"\r")
        self._buffer = buffer[start:]
        return events

    def _line(self, raw: bytes) -> tuple[str, str] | None:
        if not raw:
            return self._dispatch()
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> tuple[str, str] | None:
        event, data = self._event or "message", self._data
        self._event, self._data = "", []
        return (event, "\n".join(data)) if data else None


class StreamEnd:
    """How a translated stream ended, for both directions (`StreamTranslator` here,
    `MessagesStreamTranslator` in inbound_stream.py): a translator sets `_done` when it
    returns its last line, and `_failed` too when that was an in-band error."""

    def __init__(self) -> None:
        self._done = False
        self._failed = False

    @property
    def done(self) -> bool:
        """True once the last line has been returned: the translator ignores the rest."""
        return self._done

    @property
    def failed(self) -> bool:
        """True when the stream ended with an in-band error (an error event, or cut)."""
        return self._failed


class StreamTranslator(StreamEnd):
    """One Anthropic stream in, one OpenAI chat-completion stream out (see the module doc)."""

    def __init__(self, model: str, created: int, include_usage: bool) -> None:
        super().__init__()
        self._model = model
        self._created = created
        self._include_usage = include_usage
        self._id: str | None = None
        self._tool_index: dict[object, int] = {}  # Anthropic block index -> tool call index
        self._usage: Json = {}
        self._stop_reason: object = None
        self._stop_sequence: object = None

    @property
    def usage(self) -> Json:
        """The usage so far, in OpenAI's shape (counts are cumulative in the stream)."""
        return openai_usage(self._usage)

    def feed(self, event: str, data: Json) -> list[bytes]:
        """The OpenAI SSE lines for one Anthropic event (the name falls back to `data.type`)."""
        if self._done:
            return []
        kind = event if event and event != "message" else str(data.get("type", ""))
        if kind == "message_start":
            return self._message_start(data)
        if kind == "content_block_start":
            return self._block_start(data)
        if kind == "content_block_delta":
            return self._block_delta(data)
        if kind == "message_delta":
            self._message_delta(data)
            return []
        if kind == "message_stop":
            return self._message_stop()
        if kind == "error":
            error = data.get("error")
            return self._fail(openai_error(error if isinstance(error, dict) else None, None))
        return []

    def finish(self) -> list[bytes]:
        """The closing lines once the upstream body has ended: none if already [DONE]."""
        if self._done:
            return []
        return self._fail(
            {
                "message": "The Anthropic stream ended before the message was complete.",
                "type": "server_error",
                "param": None,
                "code": "upstream_incomplete",
            }
        )

    def _message_start(self, data: Json) -> list[bytes]:
        message = data.get("message")
        message = message if isinstance(message, dict) else {}
        if self._id is None:
            self._id = completion_id(message.get("id"))
        merge_usage(self._usage, message.get("usage"))
        return [self._chunk({"role": "assistant", "content": ""})]

    def _block_start(self, data: Json) -> list[bytes]:
        block = data.get("content_block")
        if not isinstance(block, dict):
            return []
        if block.get("type") == "text" and block.get("text"):
            return [self._chunk({"content": block["text"]})]
        if block.get("type") != "tool_use":
            return []
        index = self._tool_index.setdefault(data.get("index"), len(self._tool_index))
        call = {
            "index": index,
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": ""},
        }
        return [self._chunk({"tool_calls": [call]})]

    def _block_delta(self, data: Json) -> list[bytes]:
        delta = data.get("delta")
        if not isinstance(delta, dict):
            return []
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            return [self._chunk({"content": delta["text"]})]
        index = self._tool_index.get(data.get("index"))
        if kind == "input_json_delta" and index is not None and delta.get("partial_json"):
            call = {"index": index, "function": {"arguments": delta["partial_json"]}}
            return [self._chunk({"tool_calls": [call]})]
        return []

    def _message_delta(self, data: Json) -> None:
        delta = data.get("delta")
        if isinstance(delta, dict):
            if delta.get("stop_reason") is not None:
                self._stop_reason = delta["stop_reason"]
            if delta.get("stop_sequence") is not None:
                self._stop_sequence = delta["stop_sequence"]
        merge_usage(self._usage, data.get("usage"))

    def _message_stop(self) -> list[bytes]:
        extra = {} if self._stop_sequence is None else {"stop_reason": self._stop_sequence}
        lines = [self._chunk({}, finish_reason(self._stop_reason), extra)]
        if self._include_usage:
            usage = {**self._envelope(), "choices": [], "usage": openai_usage(self._usage)}
            lines.append(_sse(usage))
        self._done = True
        return [*lines, DONE]

    def _fail(self, error: Json) -> list[bytes]:
        self._done = True
        self._failed = True
        return [_sse({"error": error}), DONE]

    def _envelope(self) -> Json:
        if self._id is None:  # a stream that skipped message_start still gets one id
            self._id = completion_id(None)
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
        }

    def _chunk(self, delta: Json, finish: str | None = None, extra: Json | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse({**self._envelope(), "choices": [{**choice, **(extra or {})}]})


def _sse(payload: Json) -> bytes:
    return sse_data(payload)
