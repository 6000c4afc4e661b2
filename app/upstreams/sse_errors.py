"""The error event that ends an event stream, found in its last bytes.

vLLM answers a stream whose generation fails with a 200 all the same and ends it with one
error event and `data: [DONE]` (vllm/entrypoints/openai/chat_completion/serving.py:505,
completion/serving.py:556: `data: {"error": {"message", "type", "param", "code"}}`, the
`ErrorResponse` of vllm/entrypoints/serve/engine/protocol.py:86, whose `code` is the HTTP
status it stands for); older vLLM releases wrote `{"object": "error", ..., "code": N}`; an
Anthropic Messages stream ends with `event: error` (`{"type": "error", "error": {...}}`),
and an Ollama NDJSON stream (`app.api.ollama`) with a `{"error": "..."}` line.

The relay does not parse events while bytes flow: when a stream has ended, it hands its
last two chunks to `stream_error`, which looks at the last event before `[DONE]` only.
(An error event split over more than two chunks is not seen; vLLM writes each event in
one piece.) The answer is a closed label, so an activity entry's size does not depend on
what an upstream wrote: `upstream_<status>` when the event gives an HTTP status as its
code, else `upstream_error`.
"""

from __future__ import annotations

import json
from typing import Final

# How an error event's data begins (`app.routing.chains` judges a stream's first event by
# the same prefixes, before anything reaches the client).
ERROR_DATA: Final = (b'data: {"error"', b'data: {"object":"error"')
_ERROR_EVENT: Final = b"event: error"
# An NDJSON stream's error line, as Ollama's API writes it (`app.ollama.stream`).
NDJSON_ERROR: Final = b'{"error"'
_DONE: Final = b"data: [DONE]"
UPSTREAM_ERROR: Final = "upstream_error"


def stream_error(tail: bytes) -> str | None:
    """The label of the error event that ends the stream whose last bytes are `tail`
    (`upstream_500`, `upstream_error`); None when its last event is not an error."""
    if b"error" not in tail:  # the common case: one scan, no copy
        return None
    text = tail.replace(b"\r\n", b"\n").rstrip()
    if text.rpartition(b"\n")[2].startswith(NDJSON_ERROR):  # an Ollama stream's error line
        return UPSTREAM_ERROR
    if text.endswith(_DONE):
        text = text[: -len(_DONE)].rstrip()
    event = text.rpartition(b"\n\n")[2]
    lines = event.split(b"\n")
    if not (event.startswith(ERROR_DATA) or _ERROR_EVENT in lines):
        return None
    data = b"".join(line[5:].strip() for line in lines if line.startswith(b"data:"))
    return _label(data)


def _label(data: bytes) -> str:
    try:
        parsed = json.loads(data)
    except ValueError:
        return UPSTREAM_ERROR
    if not isinstance(parsed, dict):
        return UPSTREAM_ERROR
    error = parsed.get("error")
    code = error.get("code") if isinstance(error, dict) else parsed.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
        return f"upstream_{code}"
    return UPSTREAM_ERROR
