"""Metrics of the fallback chains, the providers and the token counts.

    microscheduler_fallbacks_total{chain,from_entry,to_entry,reason}
        a chain passed over `from_entry` (it failed, refused, or was skipped) and went on
        to `to_entry`; declared for every pair of neighbouring entries of every chain
    microscheduler_provider_requests_total{provider,outcome}
        requests sent to a cloud provider, by outcome: `ok` (relayed to its end),
        `client_error` (a 4xx relayed to the client), `stream_error` (broke after its
        first byte), `cancelled` (the client went away), or the fallback reason
    microscheduler_circuit_open{entry}
        1 while the entry's circuit is open (skipped), else 0; read at scrape time
    microscheduler_tokens_total{route,type}
        prompt and completion tokens by the entry that answered (a backend or a provider)

Every series is declared at zero from the configuration; labels never come from requests.

Tokens are read from the `usage` object a response carries, without parsing the body: the
last `"usage": {...}` in its last bytes. A non-streaming answer always has one; a stream
has one when the client asked for it (`stream_options.include_usage`), or when the
gateway added it for a key that counts tokens and takes it out again before the client
sees it (`app.upstreams.usage`). A translated Anthropic stream counts its usage from the
translator, whatever the client asked.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.routing.policy import REASONS, SKIP_REASONS

_NOT_FALLBACK: Final = frozenset({"ok", "client_error", "internal"})
FALLBACK_REASONS: Final = tuple(sorted(REASONS - _NOT_FALLBACK)) + SKIP_REASONS
PROVIDER_OUTCOMES: Final = (
    "ok",
    "client_error",
    "stream_error",
    "cancelled",
    *sorted(r for r in REASONS - _NOT_FALLBACK if not r.startswith("local_")),
)

_USAGE: Final = re.compile(rb'"usage"\s*:\s*\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}')
# OpenAI's names, or Anthropic's (a Messages answer, passed through or translated).
_PROMPT: Final = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*([0-9]+)')
_COMPLETION: Final = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*([0-9]+)')
_TAIL_BYTES: Final = 4096


def usage_in_tail(tail: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens from the last `"usage": {...}` in `tail`, if any (in
    OpenAI's words or Anthropic's: a Messages answer's `input_tokens`/`output_tokens`).

    About 1.5 us for a chat completion (regular expressions, no JSON parsing)."""
    at = tail.rfind(b'"usage"', -_TAIL_BYTES)
    if at < 0:
        return None
    match = _USAGE.match(tail, at)
    if match is None:
        return None
    usage = match.group(1)
    prompt, completion = _PROMPT.search(usage), _COMPLETION.search(usage)
    if prompt is None or completion is None:
        return None
    return int(prompt.group(1)), int(completion.group(1))


class TokenCounter:
    """The two token counters of one entry (children cached: no `labels()` per request)."""

    __slots__ = ("_completion", "_prompt")

    def __init__(self, prompt: Counter, completion: Counter) -> None:
        self._prompt = prompt
        self._completion = completion

    def add(self, prompt: int, completion: int) -> None:
        if prompt > 0:
            self._prompt.inc(prompt)
        if completion > 0:
            self._completion.inc(completion)

    def count_tail(self, tail: bytes) -> None:
        usage = usage_in_tail(tail)
        if usage is not None:
            self.add(*usage)


class FallbackMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        ns = "microscheduler"
        self.fallbacks = Counter(
            "fallbacks",
            "A fallback chain passed over an entry and went on to the next, by reason.",
            ["chain", "from_entry", "to_entry", "reason"],
            namespace=ns,
            registry=registry,
        )
        self.provider_requests = Counter(
            "provider_requests",
            "Requests sent to a cloud provider, by outcome.",
            ["provider", "outcome"],
            namespace=ns,
            registry=registry,
        )
        self.circuit_open = Gauge(
            "circuit_open",
            "1 while the entry's circuit breaker is open (the entry is skipped), else 0.",
            ["entry"],
            namespace=ns,
            registry=registry,
        )
        self.tokens = Counter(
            "tokens",
            "Prompt and completion tokens from the usage of answers, by the entry that answered.",
            ["route", "type"],
            namespace=ns,
            registry=registry,
        )
        self._token_counters: dict[str, TokenCounter] = {}

    def declare(
        self,
        *,
        routes: Iterable[str],
        providers: Iterable[str],
        chains: Mapping[str, Sequence[str]],
        circuit_open: Mapping[str, Callable[[], float]],
    ) -> None:
        """Create every series at zero. `circuit_open` maps an entry to its gauge's reader."""
        for route in routes:
            self.token_counter(route)
        for provider in providers:
            for outcome in PROVIDER_OUTCOMES:
                self.provider_requests.labels(provider, outcome)
        for chain, entries in chains.items():
            for before, after in itertools.pairwise(entries):
                for reason in FALLBACK_REASONS:
                    self.fallbacks.labels(chain, before, after, reason)
        for entry, read in circuit_open.items():
            self.circuit_open.labels(entry).set_function(read)

    def token_counter(self, route: str) -> TokenCounter:
        counter = self._token_counters.get(route)
        if counter is None:
            counter = TokenCounter(
                self.tokens.labels(route, "prompt"), self.tokens.labels(route, "completion")
            )
            self._token_counters[route] = counter
        return counter

    def fallback(self, chain: str, from_entry: str, to_entry: str, reason: str) -> None:
        self.fallbacks.labels(chain, from_entry, to_entry, reason).inc()

    def provider_outcome(self, provider: str, outcome: str) -> None:
        self.provider_requests.labels(provider, outcome).inc()
