"""OpenAI's answers as Ollama's (pure: no I/O): a whole chat completion as `/api/chat`'s
or `/api/generate`'s one object (`chat_answer`), `/v1/embeddings`' as `/api/embed`'s
(`embed_answer`), with Ollama's durations (`Timing`); an upstream's error answer as its
message (`error_message`). A stream's lines are `app.ollama.stream`'s. Field names are
Ollama's (api/types.go at ollama/ollama fb3076099: `ChatResponse` :520, `Metrics` :557,
`EmbedResponse` :621, `GenerateResponse` :891).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from app.ollama.wire import Json, nanoseconds, timestamp

# OpenAI's finish_reason -> Ollama's done_reason (Ollama says `stop` after tool calls too).
_DONE_REASONS: Final = {"tool_calls": "stop", "function_call": "stop"}


@dataclass(frozen=True, slots=True)
class Timing:
    """Where the time of one answer went, in seconds, for Ollama's durations
    (`Metrics`, types.go:557): `load` (waiting for the backend: its start or wake, a
    slot), `prompt` (from then to the first token; 0 when not seen, as for an answer
    read whole), `total` (the whole request, as the gateway saw it)."""

    total: float
    load: float
    prompt: float

    def metrics(self, prompt_tokens: int | None, completion_tokens: int | None) -> Json:
        out: Json = {
            "total_duration": nanoseconds(self.total),
            "load_duration": nanoseconds(self.load),
        }
        if prompt_tokens is not None:
            out["prompt_eval_count"] = prompt_tokens
        if self.prompt > 0:
            out["prompt_eval_duration"] = nanoseconds(self.prompt)
        if completion_tokens is not None:
            out["eval_count"] = completion_tokens
        out["eval_duration"] = nanoseconds(max(0.0, self.total - self.load - self.prompt))
        return out


def done_reason(finish_reason: object) -> str:
    if not isinstance(finish_reason, str) or not finish_reason:
        return "stop"
    return _DONE_REASONS.get(finish_reason, finish_reason)


def ollama_tool_calls(calls: object) -> list[Json]:
    """OpenAI's tool calls (arguments a JSON string) as Ollama's (an object)."""
    out: list[Json] = []
    for index, call in enumerate(calls if isinstance(calls, list) else []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = {}
        arguments_object = parsed if isinstance(parsed, dict) else {}
        name = function.get("name", "")
        entry: Json = {"function": {"index": index, "name": name, "arguments": arguments_object}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


def chat_answer(completion: Json, *, model: str, generate: bool, timing: Timing) -> Json:
    """A whole chat completion as `/api/chat`'s (or `/api/generate`'s) one object."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, dict) else None
    message = message if isinstance(message, dict) else {}
    usage = completion.get("usage") if isinstance(completion.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    content = message.get("content") or ""
    thinking = message.get("reasoning_content") or message.get("reasoning") or ""
    calls = ollama_tool_calls(message.get("tool_calls"))
    out = answer_text(model, generate, content, thinking, calls)
    out["done"] = True
    out["done_reason"] = done_reason(
        choice.get("finish_reason") if isinstance(choice, dict) else None
    )
    out.update(
        timing.metrics(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")))
    )
    return out


def embed_answer(answer: Json, *, model: str, timing: Timing) -> Json:
    """`/v1/embeddings`' answer as `/api/embed`'s (`EmbedResponse`, types.go:621)."""
    data = answer.get("data")
    rows = sorted(
        (item for item in data if isinstance(item, dict)) if isinstance(data, list) else [],
        key=lambda item: item.get("index", 0),
    )
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    out: Json = {
        "model": model,
        "embeddings": [row.get("embedding", []) for row in rows],
        "total_duration": nanoseconds(timing.total),
        "load_duration": nanoseconds(timing.load),
    }
    prompt = _int(usage.get("prompt_tokens"))
    if prompt is not None:
        out["prompt_eval_count"] = prompt
    return out


def error_message(status: int, body: bytes) -> str:
    """The message of an upstream's error answer (OpenAI's envelope, vLLM's, or text)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed.get("message"))
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    text = body[:2000].decode(errors="replace").strip()
    return text or f"upstream answered {status}"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def answer_text(
    model: str, generate: bool, content: str, thinking: str = "", calls: list[Json] | None = None
) -> Json:
    """An answer's text (or a stream's piece of it) as Ollama's `GenerateResponse` carries
    it (`response`, `thinking`, `tool_calls`: types.go:891) or its `ChatResponse` (the
    same in `message`: types.go:520); `done` and the counts are the caller's."""
    out: Json = {"model": model, "created_at": timestamp()}
    if generate:
        out["response"] = content
        carrier = out
    else:
        carrier = {"role": "assistant", "content": content}
        out["message"] = carrier
    if thinking:
        carrier["thinking"] = thinking
    if calls:
        carrier["tool_calls"] = calls
    return out
