"""A response's token usage, in one place: read, asked for, counted.

Read: from the `usage` object a response carries, without parsing the body (`usage_in_tail`:
the last `"usage": {...}` in its last bytes, in OpenAI's words or Anthropic's, or the counts
of Ollama's last line), or from a
parsed usage object (`tokens_of`: an SSE usage event, a stream translator's running
usage). A non-streaming answer always has one; a stream has one when the client asked for
it (`stream_options.include_usage`), or when the gateway added it (below). A translated
Anthropic stream counts its usage from the translator, whatever the client asked.

Counted: `TokenCounter` holds one entry's two counters (the gateway's per route, a key's
per entry). The one place an answer's tokens are counted is `Exchange.count`
(`app.routing.exchange`), which feeds the route's counter and the key's; everything else
here only reads.

Asked for: a key whose limits count tokens (`tpm`, `daily_cloud_tokens`) must know what every answer
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
from collections.abc import Callable, Mapping
from typing import Any, Final

from prometheus_client import Counter

from app.metrics import add
from app.settings.endpoints import Api

# The streams that carry usage only when asked (`stream_options.include_usage`).
USAGE_OPTION_APIS: Final = frozenset({Api.CHAT, Api.COMPLETIONS})
_BOUNDARY: Final = re.compile(rb"\r?\n\r?\n")

_USAGE: Final = re.compile(rb'"usage"\s*:\s*\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}')
# OpenAI's names, or Anthropic's (a Messages answer, passed through or translated).
_PROMPT: Final = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*([0-9]+)')
_COMPLETION: Final = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*([0-9]+)')
_TAIL_BYTES: Final = 4096
# Ollama's last line (`app.api.ollama`: a chat completion translated): its counts.
_OLLAMA_PROMPT: Final = re.compile(rb'"prompt_eval_count"\s*:\s*([0-9]+)')
_OLLAMA_EVAL: Final = re.compile(rb'"eval_count"\s*:\s*([0-9]+)')
_NAMES: Final = (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens"))


def usage_in_tail(tail: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens from the last `"usage": {...}` in `tail`, if any (in
    OpenAI's words or Anthropic's: a Messages answer's `input_tokens`/`output_tokens`).

    About 1.5 us for a chat completion (regular expressions, no JSON parsing)."""
    at = tail.rfind(b'"usage"', -_TAIL_BYTES)
    if at < 0:
        return _ollama_counts(tail[-_TAIL_BYTES:])
    match = _USAGE.match(tail, at)
    if match is None:
        return None
    usage = match.group(1)
    prompt, completion = _PROMPT.search(usage), _COMPLETION.search(usage)
    if prompt is None or completion is None:
        return None
    return int(prompt.group(1)), int(completion.group(1))


def _ollama_counts(tail: bytes) -> tuple[int, int] | None:
    """(prompt, completion) from Ollama's last line (`prompt_eval_count`, `eval_count`;
    Ollama leaves out a count of 0, api/types.go `Metrics`), when it has either."""
    if b'"done":true' not in tail:
        return None
    prompts, evals = _OLLAMA_PROMPT.findall(tail), _OLLAMA_EVAL.findall(tail)
    if not prompts and not evals:
        return None
    return int(prompts[-1]) if prompts else 0, int(evals[-1]) if evals else 0


def tokens_of(usage: Mapping[str, Any]) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a parsed usage object, in OpenAI's words or
    Anthropic's (`input_tokens`/`output_tokens`); None when it has neither pair."""
    for prompt_name, completion_name in _NAMES:
        prompt, completion = usage.get(prompt_name), usage.get(completion_name)
        if isinstance(prompt, int) and isinstance(completion, int):
            return prompt, completion
    return None


class TokenCounter:
    """The two token counters of one entry (children cached: no `labels()` per request)."""

    __slots__ = ("_completion", "_prompt")

    def __init__(self, prompt: Counter, completion: Counter) -> None:
        self._prompt = prompt
        self._completion = completion

    def add(self, prompt: int, completion: int) -> None:
        if prompt > 0:
            add(self._prompt, prompt)
        if completion > 0:
            add(self._completion, completion)


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
        tokens = tokens_of(usage)
        if tokens is not None:
            self._count(*tokens)
        return True
