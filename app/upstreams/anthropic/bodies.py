"""Reading an opened answer whole, shared by both directions of the translation.

A translated answer is built from the whole upstream body, so it is read into memory,
bounded: an error body to 64 KiB (enough for any error message), an answer to 32 MiB.
Only the headers that tell a client when to retry are kept from an error answer.
`whole_answer` is that reading and translating, for either direction.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, Final

from app.errors import UpstreamTimeout, UpstreamUnavailable
from app.jsonwire import json_bytes
from app.upstreams.http import BufferedResponse, Relayable

Json = dict[str, Any]

MAX_ERROR_BODY: Final = 64 * 1024
MAX_ANSWER_BODY: Final = 32 * 1024 * 1024
KEPT_ON_ERROR: Final = frozenset({b"retry-after", b"retry-after-ms"})
SSE_TYPE: Final = b"text/event-stream; charset=utf-8"


async def read_body(response: Relayable, limit: int) -> bytes:
    """The body from the first chunk on, cut at `limit` bytes (reading stops there)."""
    parts = [response.first_chunk]
    size = len(response.first_chunk)
    if not response.complete:
        async for chunk in response.rest():
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                break
    return b"".join(parts)[:limit]


def retry_headers(response: Relayable) -> list[tuple[bytes, bytes]]:
    """The `retry-after` headers of an error answer, to pass on."""
    return [(name, value) for name, value in response.headers if name in KEPT_ON_ERROR]


async def whole_answer(
    response: Relayable,
    within_s: float,
    *,
    envelope: Callable[[int, bytes], Json],
    translate: Callable[[Json], Json],
    who: str,
    what: str,
) -> BufferedResponse:
    """`response` read whole within `within_s` and released here, whatever happens.

    A non-2xx answer becomes `envelope(status, body)` with the same status (the raw body
    kept for the fallback policy, the retry headers passed on); a 200 whose body is a JSON
    object becomes `translate(body)`. `who` (the upstream, named) and `what` (the answer
    expected) word the errors: `UpstreamTimeout(kind="first_byte_timeout")` when the read
    outlasts `within_s`, `UpstreamUnavailable(kind="bad_response")` when the body is not
    a JSON object (or `translate` raises ValueError)."""
    ok = response.status == 200
    try:
        async with asyncio.timeout(max(within_s, 0.0)):
            raw = await read_body(response, MAX_ANSWER_BODY if ok else MAX_ERROR_BODY)
    except TimeoutError:
        raise UpstreamTimeout(
            f"{who} did not finish its answer in time", kind="first_byte_timeout"
        ) from None
    finally:
        response.release()
    if not ok:
        error = envelope(response.status, raw)
        answer = BufferedResponse(response.status, json_bytes(error), policy_body=raw)
        answer.headers.extend(retry_headers(response))
        return answer
    try:
        body = json.loads(raw)
        translated = translate(body) if isinstance(body, dict) else None
    except ValueError:
        translated = None
    if translated is None:
        raise UpstreamUnavailable(
            f"{who} answered 200 with a body that is not {what}", kind="bad_response"
        )
    return BufferedResponse(200, json_bytes(translated))
