"""`app.routing.tool_hint.hinted`: only vLLM's tool-parser refusal gets the hint."""

from __future__ import annotations

import json
from typing import Any

from app.routing.tool_hint import MAX_BODY, hint, hinted, is_json

AUTO = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


def test_both_envelopes_keep_everything_but_the_longer_message() -> None:
    openai: dict[str, Any] = {
        "error": {"message": AUTO, "type": "BadRequestError", "param": None, "code": 400}
    }
    anthropic: dict[str, Any] = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": AUTO},
    }
    for body in (openai, anthropic):
        out = hinted(json.dumps(body).encode(), "qwen")
        assert out is not None
        assert json.loads(out) == {
            **body,
            "error": {**body["error"], "message": AUTO + hint("qwen")},
        }


def test_a_hinted_message_is_not_hinted_again() -> None:
    once = hinted(json.dumps({"error": {"message": AUTO}}).encode(), "qwen")
    assert once is not None
    assert hinted(once, "qwen") is None


def test_anything_else_is_left_alone() -> None:
    big = json.dumps({"error": {"message": " " * MAX_BODY + AUTO}}).encode()
    for body in (
        b"",
        b"not json",
        b'["--tool-call-parser to be set"]',
        b'{"error": "--tool-call-parser to be set"}',
        b'{"error": {"message": "max_tokens=9000 cannot be greater than max_model_len=8192."}}',
        big,
    ):
        assert hinted(body, "qwen") is None


def test_is_json() -> None:
    assert is_json([(b"content-length", b"9"), (b"content-type", b"application/json")])
    assert is_json([(b"content-type", b"Application/JSON; charset=utf-8")])
    assert not is_json([(b"content-type", b"text/event-stream")])
    assert not is_json([])
