"""A chat completion's chunks written as Ollama's NDJSON lines (pure)."""

from __future__ import annotations

import json
from typing import Any

from app.ollama.stream import NdjsonTranslator


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def lines(out: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in b"".join(out).splitlines()]


def test_pieces_then_one_done_line_with_counts() -> None:
    ticks = iter([(0.5, 0.2), (1.0, 0.2)])
    translator = NdjsonTranslator("m:latest", generate=False, clock=lambda: next(ticks))
    out = translator.feed(chunk({"role": "assistant", "content": ""}))
    out += translator.feed(chunk({"content": "Hel"}))
    out += translator.feed(chunk({"content": "lo"}, "stop"))
    usage = {"prompt_tokens": 7, "completion_tokens": 2}
    out += translator.feed(json.dumps({"choices": [], "usage": usage}))
    out += translator.feed("[DONE]")
    first, second, last = lines(out)
    assert first["message"] == {"role": "assistant", "content": "Hel"}
    assert first["done"] is False
    assert first["model"] == "m:latest"
    assert second["message"]["content"] == "lo"
    assert last["done"] is True
    assert last["done_reason"] == "stop"
    assert last["prompt_eval_count"] == 7
    assert last["eval_count"] == 2
    assert last["load_duration"] == 200_000_000
    assert last["prompt_eval_duration"] == 300_000_000  # from the wait to the first token
    assert last["eval_duration"] == 500_000_000
    assert translator.done
    assert not translator.failed


def test_tool_call_pieces_go_out_whole() -> None:
    translator = NdjsonTranslator("m", generate=False, clock=lambda: (1.0, 0.0))
    out = translator.feed(chunk({"tool_calls": [
        {"index": 0, "id": "c1", "function": {"name": "get", "arguments": "{\"ci"}}]}))  # fmt: skip
    rest = {"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}
    out += translator.feed(chunk({"tool_calls": [rest]}, "tool_calls"))
    assert out == []  # nothing until the calls are whole
    calls, last = lines(translator.feed("[DONE]"))
    assert calls["message"]["tool_calls"] == [
        {"id": "c1", "function": {"index": 0, "name": "get", "arguments": {"city": "Oslo"}}}
    ]
    assert last["done_reason"] == "stop"


def test_generate_lines_and_a_cut_stream_ends_with_an_error_line() -> None:
    translator = NdjsonTranslator("m", generate=True, clock=lambda: (1.0, 0.0))
    (piece,) = lines(translator.feed(chunk({"content": "Hi"})))
    assert piece == {"model": "m", "created_at": piece["created_at"], "response": "Hi",
                     "done": False}  # fmt: skip
    (error,) = lines(translator.finish())
    assert "error" in error
    assert translator.failed


def test_an_upstream_error_event_is_ollamas_error_line() -> None:
    translator = NdjsonTranslator("m", generate=False, clock=lambda: (1.0, 0.0))
    out = translator.feed(json.dumps({"error": {"message": "boom", "code": 500}}))
    assert lines(out) == [{"error": "boom"}]
    assert translator.feed("[DONE]") == []
