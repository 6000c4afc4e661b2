"""A chat completion's event stream written as Ollama writes its streams: one JSON object
a line (`application/x-ndjson`), `done: false` for each piece of the answer, then one
`done: true` line with `done_reason` and the counts and durations (api.md:85-120,
types.go:520 `ChatResponse`, :891 `GenerateResponse`).

A tool call arrives from vLLM in pieces (its arguments a string growing chunk by chunk);
Ollama sends each call whole, so the pieces are gathered and the calls go out in one line
before the last. An error inside the stream is one `{"error": "..."}` line, as Ollama's
server writes it (server/routes.go, `streamResponse`), which its clients raise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Final

from app.jsonwire import json_bytes
from app.ollama.answers import Timing, answer_text, done_reason, ollama_tool_calls
from app.ollama.wire import Json, timestamp
from app.upstreams.anthropic.relayed import ChunksTranslated
from app.upstreams.http import Relayable

NDJSON_TYPE: Final = b"application/x-ndjson"


def line(payload: Json) -> bytes:
    return json_bytes(payload) + b"\n"


def error_line(message: str) -> bytes:
    return line({"error": message})


class NdjsonTranslator:
    """OpenAI chat chunks (each event's data) in, Ollama's lines out.

    `clock` gives `(seconds since the request began, seconds it waited for its
    backend)`: the durations of the last line."""

    def __init__(
        self, model: str, *, generate: bool, clock: Callable[[], tuple[float, float]]
    ) -> None:
        self._model = model
        self._generate = generate
        self._clock = clock
        self._first_token_s: float | None = None
        self._finish: str | None = None
        self._usage: tuple[int | None, int | None] = (None, None)
        self._calls: dict[int, Json] = {}
        self.done = False
        self.failed = False

    def feed(self, data: str) -> list[bytes]:
        if self.done:
            return []
        if data.strip() == "[DONE]":
            return self._end()
        try:
            chunk = json.loads(data)
        except ValueError:
            return []
        if not isinstance(chunk, dict):
            return []
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            return self._fail(str(message or "the upstream failed"))
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = (_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")))
        out: list[bytes] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            assert isinstance(delta, dict)
            content = delta.get("content") or ""
            thinking = delta.get("reasoning_content") or delta.get("reasoning") or ""
            self._gather(delta.get("tool_calls"))
            if content or thinking:
                if self._first_token_s is None:
                    self._first_token_s = self._clock()[0]
                out.append(self._piece(content, thinking))
            if choice.get("finish_reason"):
                self._finish = str(choice["finish_reason"])
        return out

    def finish(self) -> list[bytes]:
        """The upstream's stream ended: without `[DONE]` it was cut short."""
        if self.done:
            return []
        return self._fail("the upstream ended the stream before it was complete")

    def _piece(self, content: str, thinking: str = "", calls: list[Json] | None = None) -> bytes:
        out = answer_text(self._model, self._generate, content, thinking, calls)
        out["done"] = False
        return line(out)

    def _gather(self, deltas: object) -> None:
        for delta in deltas if isinstance(deltas, list) else ():
            if not isinstance(delta, dict):
                continue
            index = delta.get("index", len(self._calls))
            call = self._calls.setdefault(index if isinstance(index, int) else len(self._calls),
                                          {"function": {"name": "", "arguments": ""}})  # fmt: skip
            if isinstance(delta.get("id"), str):
                call["id"] = delta["id"]
            function = delta.get("function")
            if isinstance(function, dict):
                if isinstance(function.get("name"), str):
                    call["function"]["name"] += function["name"]
                if isinstance(function.get("arguments"), str):
                    call["function"]["arguments"] += function["arguments"]

    def _end(self) -> list[bytes]:
        self.done = True
        out: list[bytes] = []
        if self._calls:
            calls = ollama_tool_calls([self._calls[i] for i in sorted(self._calls)])
            out.append(self._piece("", calls=calls))
        total, load = self._clock()
        first = self._first_token_s
        prompt = 0.0 if first is None else max(0.0, first - load)
        timing = Timing(total=total, load=load, prompt=prompt)
        last: Json = {"model": self._model, "created_at": timestamp()}
        if self._generate:
            last["response"] = ""
        else:
            last["message"] = {"role": "assistant", "content": ""}
        last["done"] = True
        last["done_reason"] = done_reason(self._finish)
        last.update(timing.metrics(*self._usage))
        out.append(line(last))
        return out

    def _fail(self, message: str) -> list[bytes]:
        self.done = self.failed = True
        return [error_line(message)]


class NdjsonStream(ChunksTranslated):
    """An OpenAI chunk stream relayed as Ollama's NDJSON lines."""

    _translator: NdjsonTranslator

    def __init__(self, response: Relayable, translator: NdjsonTranslator) -> None:
        super().__init__(response, translator)
        self.headers = [(b"content-type", NDJSON_TYPE)]
        self.first_chunk = self._translate(response.first_chunk)


def request_clock(started: float, waited: Callable[[], float]) -> Callable[[], tuple[float, float]]:
    """`(seconds since `started` (a `time.perf_counter()`), seconds waited)` on each call."""

    def clock() -> tuple[float, float]:
        return time.perf_counter() - started, waited()

    return clock


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
