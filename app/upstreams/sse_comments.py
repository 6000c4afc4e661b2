"""Where an event stream's content begins, past the SSE comments and blank lines before it.

A vLLM started with `--sse-keep-alive-interval N` writes the comment `": keep-alive\\n\\n"`
whenever a `/v1/chat/completions` or `/v1/completions` stream has been idle for N seconds:
while the request is queued, during prefill, between tokens
(vllm/entrypoints/serve/utils/sse_keep_alive.py `SSE_KEEP_ALIVE_COMMENT`, wrapped around
the stream in vllm/entrypoints/openai/chat_completion/api_router.py and
completion/api_router.py; the flag is vllm/entrypoints/common/cli_args.py
`sse_keep_alive_interval`, 0 = off by default). Such comments can come before the first
event, and that event may be an error (`data: {"error": ...}`, which vLLM sends inside a
200 stream when generation fails: chat_completion/serving.py, completion/serving.py).

A comment is not content (SSE: a line starting with `:` is ignored, as is a blank line
that dispatches no data), so the gateway's "first content byte", before which it may
still fall back, is the first byte of the first other line. `HttpUpstream.open` reads on
past leading comments (bounded by `MAX_PEEK_BYTES` and by its first-byte timeout) and
keeps every byte it read, relayed unchanged; the fallback policy then judges the first
event. A stream whose first byte is not `:` or a line end costs one comparison.
"""

from __future__ import annotations

from typing import Final

# What may be read past leading comments before giving up and treating them as content:
# a keep-alive is 15 bytes, so a minute of them at the smallest interval (1 s) is ~1 KiB.
MAX_PEEK_BYTES: Final = 64 * 1024
COLON: Final = 0x3A
_CR: Final = 0x0D
_LF: Final = 0x0A


def may_start_with_comment(chunk: bytes) -> bool:
    """Whether `chunk` may begin with comments or blank lines (the only case worth a look)."""
    return bool(chunk) and chunk[0] in (COLON, _CR, _LF)


def content_start(buf: bytes) -> int | None:
    """The index of the first line of `buf` that is neither a comment nor blank; None while
    `buf` holds only those (its last line possibly unfinished), or nothing."""
    i, n = 0, len(buf)
    while i < n:
        byte = buf[i]
        if byte in (_LF, _CR):
            i += 1
            continue
        if byte != COLON:
            return i
        end = _line_end(buf, i)
        if end < 0:
            return None  # a comment still arriving
        i = end + 1
    return None


def _line_end(buf: bytes, start: int) -> int:
    """The index of the first CR or LF at or after `start`; -1 when there is none."""
    lf, cr = buf.find(b"\n", start), buf.find(b"\r", start)
    if lf < 0 or cr < 0:
        return max(lf, cr)
    return min(lf, cr)
