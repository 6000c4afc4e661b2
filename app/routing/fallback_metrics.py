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
How the tokens are read from an answer and counted: `app.upstreams.usage`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from prometheus_client import CollectorRegistry

from app.metrics import Declare
from app.routing.policy import REASONS, SKIP_REASONS
from app.upstreams.usage import TokenCounter

_NOT_FALLBACK: Final = frozenset({"ok", "client_error", "internal"})
FALLBACK_REASONS: Final = tuple(sorted(REASONS - _NOT_FALLBACK)) + SKIP_REASONS
PROVIDER_OUTCOMES: Final = (
    "ok",
    "client_error",
    "stream_error",
    "cancelled",
    *sorted(r for r in REASONS - _NOT_FALLBACK if not r.startswith("local_")),
)


class FallbackMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        new = Declare(registry)
        self.fallbacks = new.counter(
            "fallbacks",
            "A fallback chain passed over an entry and went on to the next, by reason.",
            ("chain", "from_entry", "to_entry", "reason"),
        )
        self.provider_requests = new.counter(
            "provider_requests",
            "Requests sent to a cloud provider, by outcome.",
            ("provider", "outcome"),
        )
        self.circuit_open = new.gauge(
            "circuit_open",
            "1 while the entry's circuit breaker is open (the entry is skipped), else 0.",
            ("entry",),
        )
        self.tokens = new.counter(
            "tokens",
            "Prompt and completion tokens from the usage of answers, by the entry that answered.",
            ("route", "type"),
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
