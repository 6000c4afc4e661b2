"""Reading an opened answer whole, shared by both directions of the translation.

A translated answer is built from the whole upstream body, so it is read into memory,
bounded: an error body to 64 KiB (enough for any error message), an answer to 32 MiB.
Only the headers that tell a client when to retry are kept from an error answer.
"""

from __future__ import annotations

from typing import Final

from app.upstreams.http import Relayable

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
