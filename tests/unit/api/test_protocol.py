from __future__ import annotations

import json

import pytest

from app.api.protocol import CHAT, COMPLETIONS, EMBEDDINGS, parse_request
from app.errors import InvalidRequest
from app.routing.registry import Route
from app.routing.shaping import upstream_body


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_valid_chat_request_parses() -> None:
    raw = body(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    parsed = parse_request(raw, CHAT)
    assert (parsed.model, parsed.stream, parsed.raw) == ("m", True, raw)


BAD_REQUESTS = [
    (b"{not json", CHAT, "The request body is not valid JSON", None),
    (b"\xff\xfe", CHAT, "The request body is not valid JSON", None),
    (b"[1, 2]", CHAT, "must be a JSON object", None),
    (body(messages=[]), CHAT, "You must provide a model parameter", "model"),
    (body(model=7, messages=[]), CHAT, "expected a non-empty string, but got integer", "model"),
    (body(model="", messages=[]), CHAT, "expected a non-empty string, but got string", "model"),
    (body(model="m", messages=[], stream="yes"), CHAT, "'stream': expected a boolean", "stream"),
    (
        body(model="m", messages=[], stream_options=[]),
        CHAT,
        "'stream_options': expected an object",
        "stream_options",
    ),
    (body(model="m"), CHAT, "Missing required parameter: 'messages'", "messages"),
    (
        body(model="m", messages="hi"),
        CHAT,
        "'messages': expected an array, but got string",
        "messages",
    ),
    (body(model="m"), COMPLETIONS, "Missing required parameter: 'prompt'", "prompt"),
    (body(model="m", prompt=3), COMPLETIONS, "a string or an array, but got integer", "prompt"),
    (body(model="m", input=None), EMBEDDINGS, "a string or an array, but got null", "input"),
]


@pytest.mark.parametrize(("raw", "endpoint", "message", "param"), BAD_REQUESTS)
def test_bad_requests_are_400_with_a_precise_message(
    raw: bytes, endpoint: object, message: str, param: str | None
) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(raw, endpoint)  # type: ignore[arg-type]
    assert info.value.status == 400
    assert message in info.value.message
    assert info.value.param == param


def test_null_stream_means_not_streaming() -> None:
    assert parse_request(body(model="m", prompt="x", stream=None), COMPLETIONS).stream is False


def test_a_json_body_is_never_written_by_the_route() -> None:
    """An alias's model is put in where the body is sent (`local_body`, once, with any
    other change), not here: the route hands on the client's bytes."""
    raw = b'{"model": "r1", "messages": [], "extra": {"keep": "\\u00e9"}}'
    parsed = parse_request(raw, CHAT)
    assert upstream_body(parsed, Route("r1", "b", "r1")) is raw
    assert upstream_body(parsed, Route("alias", "b", "r1-14b")) is raw
