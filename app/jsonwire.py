"""JSON as the gateway writes it: every body and SSE event it builds goes through
`json_bytes`.

A client may send a lone surrogate as a JSON escape (`"\\ud800"`): valid JSON, but once
decoded a `str` that UTF-8 cannot encode, and a model may echo it back. Such a document is
written with `ensure_ascii`, so the surrogate stays the escape the client wrote: the bytes
are valid UTF-8 and valid JSON, and decode to the same text. (The other ways out are worse:
`surrogatepass` writes bytes that are not UTF-8, which strict parsers refuse; `replace`
changes what the client said.) Anything else is written as UTF-8 (no escapes), the common
case costing one `encode`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.errors import ErrorCode, InvalidRequest


def json_bytes(value: object, *, default: Callable[[Any], Any] | None = None) -> bytes:
    """`value` as compact JSON bytes, lone surrogates kept as escapes. Nesting too deep
    for `json` (only a client's body nests that deep) is the client's 400."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=default)
        try:
            return text.encode()
        except UnicodeEncodeError:
            return json.dumps(value, separators=(",", ":"), default=default).encode()
    except RecursionError:
        raise too_deep() from None


def sse_data(value: object) -> bytes:
    """One `data: {json}` server-sent event (OpenAI's streams)."""
    return b"data: " + json_bytes(value) + b"\n\n"


def sse_event(event: str, value: object, *, default: Callable[[Any], Any] | None = None) -> bytes:
    """One named event: `event: <name>` then `data: {json}`."""
    return b"event: " + event.encode() + b"\ndata: " + json_bytes(value, default=default) + b"\n\n"


def too_deep() -> InvalidRequest:
    """Python's `json` gives up on nesting about a thousand levels deep (the recursion
    limit, less the stack already in use)."""
    return InvalidRequest(
        "The request body is not valid JSON: it is nested too deeply.",
        code=ErrorCode.INVALID_JSON,
    )
