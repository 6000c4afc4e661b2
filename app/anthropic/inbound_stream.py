"""OpenAI chat-completion chunks as Anthropic's streamed Messages events. Pure: no I/O.

`MessagesStreamTranslator.feed` takes one OpenAI SSE `data:` payload (a JSON chunk, or
"[DONE]") and returns the Anthropic SSE events to send (`event: <type>\\ndata: <json>\\n\\n`);
`finish` returns the closing events once the upstream body has ended. The caller parses
the body with `SseParser` (stream.py).

Mapping (docs.anthropic.com/en/docs/build-with-claude/streaming):

    first chunk                   message_start: empty content, stop_reason null,
                                  usage {input_tokens: 0, output_tokens: 0}
    delta.content                 content_block_start text (unless a text block is open),
                                  then content_block_delta text_delta
    delta.tool_calls, new index   closes the open block; content_block_start tool_use
    (or an id)                    {id, name, input: {}}
    ...function.arguments         content_block_delta input_json_delta (to that call's
                                  block while it is open; late pieces for a closed block
                                  cannot be sent and are dropped, logged)
    finish_reason                 closes the open block; the stop reason is remembered
                                  (`stop_reason` in inbound.py: the same table as answers)
    usage (any chunk)             remembered: prompt and completion tokens
    [DONE]                        message_delta {stop_reason, stop_sequence} with usage
                                  {output_tokens, input_tokens}, then message_stop
    {"error": ...} or vLLM's      error event (type from the error's status code, else
    {"object": "error", ...}      api_error); the stream is over
    reasoning deltas              dropped: a thinking block needs a signature, and the
    (reasoning_content, reasoning) client would send it back for nothing
    role-only deltas              nothing (beyond message_start)

A body that ends (or a [DONE] that comes) before any finish_reason was cut: an `error`
event (api_error) ends the stream, never a made-up stop reason. One that ends after the
finish_reason but without [DONE] is complete: message_delta and message_stop are sent.
After the end the translator ignores everything.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

from app.anthropic.inbound import (
    anthropic_error,
    anthropic_usage,
    openai_error_message,
    stop_reason,
    tool_use_id,
)
from app.anthropic.stream import StreamEnd
from app.jsonwire import sse_event as json_sse_event

Json = dict[str, Any]

logger = logging.getLogger(__name__)

DONE_DATA: Final = "[DONE]"
_CUT: Final = "The upstream stream ended before the message was complete."
_MALFORMED: Final = "The upstream stream carried a malformed chunk."


def sse_event(payload: Json) -> bytes:
    """One Anthropic SSE event; the event name is the payload's `type`."""
    return json_sse_event(str(payload["type"]), payload)


def ping_event() -> bytes:
    return sse_event({"type": "ping"})


def error_event(status: int, message: str) -> bytes:
    """An in-band `error` event, its type from `status` as in `anthropic_error`."""
    return sse_event(anthropic_error(status, message))


class MessagesStreamTranslator(StreamEnd):
    """One OpenAI chunk stream in, one Anthropic Messages stream out (see the module doc);
    `done` once message_stop or an error event has been returned."""

    def __init__(self, model: str, message_id: str) -> None:
        super().__init__()
        self._model = model
        self._id = message_id
        self._started = False
        self._blocks = 0  # content blocks started so far
        self._open: int | None = None  # the open block's index
        self._open_text = False
        self._tool_blocks: dict[object, tuple[int, str]] = {}  # OpenAI index -> (block, id)
        self._usage: Json = {}
        self._stop: tuple[str, str | None] | None = None

    @property
    def usage(self) -> Json:
        """The usage so far in Anthropic's shape: {input_tokens, output_tokens}."""
        return anthropic_usage(self._usage)

    def feed(self, data: str) -> list[bytes]:
        """The Anthropic events for one OpenAI `data:` payload."""
        if self._done:
            return []
        if data.strip() == DONE_DATA:
            return self._end()
        try:
            chunk: object = json.loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            return self._fail(anthropic_error(500, _MALFORMED))
        if "error" in chunk or chunk.get("object") == "error":
            return self._fail(_in_band_error(chunk))
        out = self._start()
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            return out
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content")
            if isinstance(text, str) and text:
                out.extend(self._text(text))
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    out.extend(self._tool_call(call))
        if choice.get("finish_reason") is not None:
            out.extend(self._close())
            self._stop = stop_reason(choice["finish_reason"], choice.get("stop_reason"))
        return out

    def finish(self) -> list[bytes]:
        """The closing events once the upstream body has ended: none if already over."""
        if self._done:
            return []
        return self._end()

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        message: Json = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [sse_event({"type": "message_start", "message": message})]

    def _text(self, text: str) -> list[bytes]:
        out = [] if self._open_text else self._open_block({"type": "text", "text": ""})
        self._open_text = True
        delta = {"type": "text_delta", "text": text}
        out.append(sse_event({"type": "content_block_delta", "index": self._open, "delta": delta}))
        return out

    def _tool_call(self, call: Json) -> list[bytes]:
        key = call.get("index", 0)
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        out: list[bytes] = []
        known = self._tool_blocks.get(key)
        call_id = call.get("id")
        if known is None or (call_id and call_id != known[1]):  # some servers repeat the id
            known = (self._blocks, str(call_id or tool_use_id()))
            block = {
                "type": "tool_use",
                "id": known[1],
                "name": str(function.get("name") or ""),
                "input": {},
            }
            out.extend(self._open_block(block))
            self._tool_blocks[key] = known
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            index = known[0]
            if index != self._open:
                logger.warning("openai_stream_late_tool_arguments index=%s", key)
                return out
            delta = {"type": "input_json_delta", "partial_json": arguments}
            out.append(sse_event({"type": "content_block_delta", "index": index, "delta": delta}))
        return out

    def _open_block(self, block: Json) -> list[bytes]:
        out = self._close()
        self._open = self._blocks
        self._blocks += 1
        start = {"type": "content_block_start", "index": self._open, "content_block": block}
        return [*out, sse_event(start)]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        index, self._open, self._open_text = self._open, None, False
        return [sse_event({"type": "content_block_stop", "index": index})]

    def _end(self) -> list[bytes]:
        if self._stop is None:
            return self._fail(anthropic_error(500, _CUT))
        out = [*self._start(), *self._close()]
        reason, sequence = self._stop
        counts = self.usage
        usage = {"output_tokens": counts["output_tokens"], "input_tokens": counts["input_tokens"]}
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage,
        }
        self._done = True
        return [*out, sse_event(delta), sse_event({"type": "message_stop"})]

    def _fail(self, error: Json) -> list[bytes]:
        self._done = True
        self._failed = True
        return [sse_event(error)]


def _in_band_error(chunk: Json) -> Json:
    """Anthropic's error for an OpenAI in-band error chunk; the status from its `code`."""
    inner = chunk.get("error")
    source = inner if isinstance(inner, dict) else chunk
    code = source.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else 500
    return anthropic_error(status, openai_error_message(chunk) or "The upstream reported an error.")
