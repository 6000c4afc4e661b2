"""Where an event stream's content begins past SSE comments (vLLM's `: keep-alive`)."""

from __future__ import annotations

import pytest

from app.upstreams.sse_comments import content_start, may_start_with_comment

# vllm/entrypoints/serve/utils/sse_keep_alive.py (0.33): SSE_KEEP_ALIVE_COMMENT
PING = b": keep-alive\n\n"
ERROR = b'data: {"error": {"message": "boom", "type": "InternalServerError"}}\n\n'


@pytest.mark.parametrize(
    ("buf", "start"),
    [
        (ERROR, 0),  # the usual stream: content at once
        (PING + ERROR, len(PING)),
        (PING * 3 + b"data: {", 3 * len(PING)),  # the event still arriving counts
        (b"\r\n: x\r\n\r\ndata: 1", 9),  # CRLF line ends
        (b":a\r:b\rdata: 1", 6),  # CR line ends
        (b"event: message\n", 0),  # any field is content
        (PING, None),  # only comments so far
        (PING + b": keep-al", None),  # a comment still arriving
        (b"\n\n", None),
        (b"", None),
    ],
)
def test_content_starts_at_the_first_line_that_is_not_a_comment(
    buf: bytes, start: int | None
) -> None:
    assert content_start(buf) == start


def test_only_a_colon_or_a_line_end_first_is_worth_a_look() -> None:
    assert may_start_with_comment(PING)
    assert may_start_with_comment(b"\n")
    assert not may_start_with_comment(ERROR)
    assert not may_start_with_comment(b"")
