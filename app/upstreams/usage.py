"""A stream's token usage when the client did not ask for it.

A key whose limits count tokens (`tpm`, `daily_cloud_tokens`) must know what every answer
used, streams included; a stream carries its usage only when the client asked with
`stream_options: {"include_usage": true}`. For such a key the gateway asks on the client's
behalf (`with_usage`) and takes the extra event out of what it relays (`UsageStripper`):
the last event before `[DONE]`, `{"choices": [], "usage": {...}, ...}` in OpenAI's and
vLLM's streams (vLLM writes it with `exclude_unset`, so no other chunk gains a `usage`
field). Every other byte is relayed as it came, cut at event boundaries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final

from app.settings.endpoints import Api

# The streams that carry usage only when asked (`stream_options.include_usage`).
USAGE_OPTION_APIS: Final = frozenset({Api.CHAT, Api.COMPLETIONS})
_BOUNDARY: Final = re.compile(rb"\r?\n\r?\n")


def asks_usage(payload: dict[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def with_usage(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` asking for the stream's usage (the client's other options kept)."""
    options = payload.get("stream_options")
    kept = options if isinstance(options, dict) else {}
    return {**payload, "stream_options": {**kept, "include_usage": True}}


class UsageStripper:
    """Relays SSE events, holding back the usage-only event, whose tokens go to `count`."""

    __slots__ = ("_count", "_pending")

    def __init__(self, count: Callable[[int, int], None]) -> None:
        self._count = count
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of `chunk` (with what was held back) to relay now: whole events only."""
        data = self._pending + chunk
        ends = [m.end() for m in _BOUNDARY.finditer(data)]
        if not ends:
            self._pending = data
            return b""
        self._pending = data[ends[-1] :]
        events = data[: ends[-1]]
        if b'"usage"' not in events:
            return events
        out, start = [], 0
        for end in ends:
            event = data[start:end]
            start = end
            if b'"usage"' in event and self._usage_only(event):
                continue
            out.append(event)
        return b"".join(out)

    def flush(self) -> bytes:
        """The end of the stream: whatever is still held (an unterminated last event)."""
        rest, self._pending = self._pending, b""
        return rest

    def _usage_only(self, event: bytes) -> bool:
        line = event.strip()
        if not line.startswith(b"data:"):
            return False
        try:
            parsed = json.loads(line[5:])
        except ValueError:
            return False
        if not isinstance(parsed, dict) or parsed.get("choices") != []:
            return False
        usage = parsed.get("usage")
        if not isinstance(usage, dict):
            return False
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            self._count(prompt, completion)
        return True
