"""`stream_error`: the error event that ends a stream, read from its last chunks only."""

from __future__ import annotations

import pytest

from app.upstreams.sse_errors import stream_error

CHUNK = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":"an error in your code"},"finish_reason":null}]}\n\n'
)
# vLLM 0.33 chat_completion/serving.py:505: json.dumps of ErrorResponse, then [DONE].
VLLM_ERROR = (
    b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
    b'"param": null, "code": 500}}\n\n'
)
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("tail", "label"),
    [
        (CHUNK + VLLM_ERROR + DONE, "upstream_500"),
        (VLLM_ERROR + DONE, "upstream_500"),
        (VLLM_ERROR, "upstream_500"),  # a stream without [DONE] after it
        ((CHUNK + VLLM_ERROR + DONE).replace(b"\n", b"\r\n"), "upstream_500"),
        # pydantic's model_dump_json (no spaces), a 400 from the engine's checks
        (b'data: {"error":{"message":"bad","type":"BadRequestError","param":null,'
         b'"code":400}}\n\ndata: [DONE]\n\n', "upstream_400"),
        # older vLLM releases: the error's fields at the top level
        (b'data: {"object":"error","message":"x","type":"x","code":503}\n\n' + DONE,
         "upstream_503"),
        # the gateway's own form relayed from another gateway: a string code
        (b'data: {"error": {"message": "m", "type": "server_error", "param": null, '
         b'"code": "upstream_timeout"}}\n\n' + DONE, "upstream_error"),
        # Anthropic's Messages stream
        (b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
         b'"message":"Overloaded"}}\n\n', "upstream_error"),
        (b'data: {"error": {"message": "cut', "upstream_error"),  # unreadable: still an error
    ],
)  # fmt: skip
def test_an_error_event_before_done_is_found(tail: bytes, label: str) -> None:
    assert stream_error(tail) == label


@pytest.mark.parametrize(
    "tail",
    [
        CHUNK + DONE,  # the content says "error": not an error event
        VLLM_ERROR + CHUNK + DONE,  # an error that is not the last event
        b'data: {"choices":[{"delta":{"content":"data: {\\"error\\""}}]}\n\n' + DONE,
        b"",
        DONE,
    ],
)
def test_a_stream_that_ended_well_has_none(tail: bytes) -> None:
    assert stream_error(tail) is None


def test_an_ollama_stream_ending_with_an_error_line() -> None:
    """Ollama's NDJSON (app.api.ollama): its in-band error is the last line."""
    piece = b'{"model":"m","message":{"role":"assistant","content":"{\\"error\\""},"done":false}\n'
    assert stream_error(piece + b'{"error":"the upstream ended the stream"}\n') == "upstream_error"
    assert stream_error(piece) is None  # "error" in the content is no error line
