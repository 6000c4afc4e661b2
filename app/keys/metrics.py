"""Per-key metrics. Labels come from the configuration (key names, entries), never from
requests, and never hold a secret.

    microscheduler_key_requests_total{key,outcome}
        requests by the key that made them: `served` (an upstream answer was relayed),
        `error` (the gateway answered with an error: backend down, chain exhausted...),
        `cancelled` (the client went away before an answer),
        `rate_limited` (a limit of the key: 429), `forbidden` (a model outside its scope: 403)
    microscheduler_key_tokens_total{key,route,type}
        prompt and completion tokens from the usage of the key's answers, by the entry that
        answered (a backend or a provider)
    microscheduler_key_limited_total{key,limit}
        requests a limit refused (`rpm`, `tpm`, `max_concurrent`), and requests that could
        not fall back to the cloud because the key's `daily_cloud_tokens` were spent
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from prometheus_client import CollectorRegistry

from app.metrics import TOKEN_TYPES, Declare

OUTCOMES: Final = ("served", "error", "cancelled", "rate_limited", "forbidden")
LIMITS: Final = ("rpm", "tpm", "max_concurrent", "daily_cloud_tokens")


class KeyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        new = Declare(registry)
        self.requests = new.counter(
            "key_requests",
            "Requests by client key (keys.yaml name), by outcome.",
            ("key", "outcome"),
        )
        self.tokens = new.counter(
            "key_tokens",
            "Prompt and completion tokens of a client key's answers, by the entry that answered.",
            ("key", "route", "type"),
        )
        self.limited = new.counter(
            "key_limited",
            "Requests of a client key refused (or kept off the cloud) by one of its limits.",
            ("key", "limit"),
        )

    def declare(self, key: str, entries: Iterable[str]) -> None:
        """Every series of `key` at zero, so dashboards see them before traffic."""
        for outcome in OUTCOMES:
            self.requests.labels(key, outcome)
        for limit in LIMITS:
            self.limited.labels(key, limit)
        for entry in entries:
            for kind in TOKEN_TYPES:
                self.tokens.labels(key, entry, kind)
