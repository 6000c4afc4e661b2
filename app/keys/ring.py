"""Who is calling: the client keys (keys.yaml and `MICROSCHEDULER_API_KEYS`) and, per key,
its scope, priority and limits, checked on every request.

- `KeyRing.identify(token)` finds a key by the SHA-256 of the token: one hash and one
  dictionary lookup, whatever the number of keys. (Timing can at most tell something about
  the hash of what the client sent, which says nothing about any key.) The secrets
  themselves are read once, hashed, and not kept.
- `ClientKey.admit()` checks the limits and returns a `KeyUse`, which the request holds to
  its end: it counts the request in flight (`max_concurrent`), its tokens (`tpm`, the daily
  cloud budget, the per-key metrics) and its outcome.
- With no key configured the gateway is open and every client is `anonymous` (no limits).

Limits live in this process's memory: two gateway replicas each allow a key its `rpm`,
and a restart starts the windows again.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import Counter

from app.errors import ModelNotAllowed, RateLimited
from app.keys.limits import (
    DailyTokens,
    Refusal,
    RequestWindow,
    TokenWindow,
    duration_text,
)
from app.keys.metrics import LIMITS, OUTCOMES, KeyMetrics
from app.metrics import add
from app.settings.keys import KeyConfig, KeysConfig, Priority, secret_digest
from app.upstreams.usage import TokenCounter

ANONYMOUS: Final = "anonymous"
_NO_LIMITS: Final = KeyConfig(key_sha256="0" * 64)
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class _Rate:
    """One of a key's rate limits and how OpenAI words it in a 429 and its headers."""

    limit: str  # rpm | tpm: the metric label
    window: RequestWindow | TokenWindow
    unit: str  # x-ratelimit-*-<unit>
    words: str  # "... on <words>: Limit ..."
    asked: str  # after "Used N" in the 429 (the request's own count, for rpm)


def env_key_name(index: int) -> str:
    """The name of the `index`-th key of `MICROSCHEDULER_API_KEYS` (from 1)."""
    return f"api-key-{index}"


class ClientKey:
    """One key: what it may use and what it has used (in this process)."""

    def __init__(
        self,
        name: str,
        config: KeyConfig,
        metrics: KeyMetrics,
        *,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.priority: Priority = config.priority
        self.models = None if config.models is None else frozenset(config.models)
        self.lifecycle = config.lifecycle  # may load and unload the models in its scope
        # Streams must carry their usage to the gateway when a limit counts tokens.
        self.counts_tokens = config.counts_tokens
        self.in_flight = 0
        self._rpm = None if config.rpm is None else RequestWindow(config.rpm)
        self._tpm = None if config.tpm is None else TokenWindow(config.tpm)
        self._daily = (
            None if config.daily_cloud_tokens is None else DailyTokens(config.daily_cloud_tokens)
        )
        self._clock, self._wall = clock, wall
        self._on_change = on_change  # what /status shows of it changed (live page)
        # on_budget(level, **fields): the daily cloud tokens passed 80 % or 100 % (set by
        # the services: a notification).
        self.on_budget: Callable[..., None] | None = None
        self._metrics = metrics
        self._outcomes = {o: _Count(metrics.requests.labels(name, o)) for o in OUTCOMES}
        self._limited = {limit: _Count(metrics.limited.labels(name, limit)) for limit in LIMITS}
        self._tokens: dict[str, TokenCounter] = {}
        self._rates = tuple(
            _Rate(limit, window, unit, words, asked)
            for limit, window, unit, words, asked in (
                ("rpm", self._rpm, "requests", "requests per min (RPM)", ", Requested 1"),
                ("tpm", self._tpm, "tokens", "tokens per min (TPM)", ""),
            )
            if window is not None
        )
        self.rate_limited = bool(self._rates)

    # -- scope ------------------------------------------------------------------------

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    def check_model(self, model: str) -> None:
        """Raise 403 `model_not_allowed` (counted) for a model outside the key's scope."""
        if not self.allows(model):
            self._outcomes["forbidden"].inc()
            self._changed()
            raise ModelNotAllowed(model, self.name)

    # -- limits -----------------------------------------------------------------------

    def admit(self) -> KeyUse:
        """Take one request within the key's limits (429 `rate_limit_exceeded` otherwise)."""
        now = self._clock()
        refusal = self._refusal(now)
        if refusal is not None:
            self._limited[refusal.limit].inc()
            self._outcomes["rate_limited"].inc()
            self._changed()
            headers = {"retry-after": str(max(1, math.ceil(refusal.retry_after_s)))}
            headers.update(self.rate_headers(now))
            raise RateLimited(refusal.message, headers=headers)
        if self._rpm is not None:
            self._rpm.add(now)
        self.in_flight += 1
        cloud, unknown, daily = self.config.cloud, False, self._daily
        if cloud and daily is not None and daily.exhausted(wall := self._wall()):
            cloud, unknown = False, daily.is_unknown(wall)
        return KeyUse(
            self, cloud=cloud, budget_spent=cloud != self.config.cloud, budget_unknown=unknown
        )

    def _refusal(self, now: float) -> Refusal | None:
        cfg = self.config
        if cfg.max_concurrent is not None and self.in_flight >= cfg.max_concurrent:
            return Refusal(
                "max_concurrent",
                1.0,
                f"Too many requests in flight for key '{self.name}': limit "
                f"{cfg.max_concurrent} (max_concurrent). Retry when one has finished.",
            )
        for rate in self._rates:
            wait = rate.window.reset_in(now)
            if wait > 0:
                return Refusal(
                    rate.limit,
                    wait,
                    f"Rate limit reached for key '{self.name}' on {rate.words}: "
                    f"Limit {rate.window.limit}, Used {rate.window.used(now)}{rate.asked}. "
                    f"Please try again in {duration_text(wait)}.",
                )
        return None

    def rate_headers(self, now: float | None = None) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` headers for the key's rpm and tpm (none without them).
        `reset-*` is, as OpenAI words it, the time until the limit is back to its initial
        state (the window empty); `Retry-After` on a 429 is when the next request fits."""
        if not self.rate_limited:
            return {}
        now = self._clock() if now is None else now
        headers = {}
        for rate in self._rates:
            limit, used = rate.window.limit, rate.window.used(now)
            headers[f"x-ratelimit-limit-{rate.unit}"] = str(limit)
            headers[f"x-ratelimit-remaining-{rate.unit}"] = str(max(0, limit - used))
            headers[f"x-ratelimit-reset-{rate.unit}"] = duration_text(rate.window.empty_in(now))
        return headers

    # -- use --------------------------------------------------------------------------

    def _finished(self, outcome: str) -> None:
        self.in_flight -= 1
        self._outcomes[outcome].inc()
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def _count(self, entry: str, cloud: bool, prompt: int, completion: int) -> None:
        counter = self._tokens.get(entry)
        if counter is None:
            counter = TokenCounter(
                self._metrics.tokens.labels(self.name, entry, "prompt"),
                self._metrics.tokens.labels(self.name, entry, "completion"),
            )
            self._tokens[entry] = counter
        counter.add(prompt, completion)
        total = max(0, prompt) + max(0, completion)
        if self._tpm is not None:
            self._tpm.add(self._clock(), total)
        if cloud and self._daily is not None:
            wall = self._wall()
            before = self._daily.spent(wall)
            self._daily.add(wall, total)
            self._budget_crossed(before, self._daily.spent(wall), self._daily.limit)

    def _budget_crossed(self, before: int, after: int, limit: int) -> None:
        """Tell `on_budget` when this day's cloud tokens pass 80 % or all of the budget."""
        for level, share in (("budget_80", 0.8), ("budget_exhausted", 1.0)):
            if before < limit * share <= after and self.on_budget is not None:
                self.on_budget(level, key=self.name, spent=after, daily_cloud_tokens=limit)

    def restore_cloud_spent(self, spent: int, wall: float) -> None:
        if self._daily is not None:
            self._daily.restore(wall, spent)
            self._changed()

    def carry_cloud_spent(self, before: ClientKey) -> None:
        """A reload replaced `before` (the same name, another secret or settings): today's
        cloud spend goes on, so a new `daily_cloud_tokens` counts what was spent already
        (and a spend that could not be read stays unknown)."""
        if self._daily is None or before._daily is None:
            return
        wall = self._wall()
        if before._daily.is_unknown(wall):
            self._daily.unknown(wall)
        else:
            self._daily.restore(wall, before._daily.spent(wall))

    def cloud_spent_unknown(self, wall: float) -> bool:
        if self._daily is None:
            return False
        self._daily.unknown(wall)
        self._changed()
        return True

    def view(self) -> dict[str, Any]:
        """What `/status` and the page show: settings and use, never the secret."""
        now, cfg, daily = self._clock(), self.config, self._daily
        return {
            "name": self.name,
            "models": None if self.models is None else sorted(self.models),
            "cloud": cfg.cloud,
            "priority": str(self.priority),
            "weight": cfg.weight,  # its share of a backend's turns within its priority
            "in_flight": self.in_flight,
            "max_concurrent": cfg.max_concurrent,
            "rpm": cfg.rpm,
            "requests_last_minute": None if self._rpm is None else self._rpm.used(now),
            "tpm": cfg.tpm,
            "tokens_last_minute": None if self._tpm is None else self._tpm.used(now),
            "daily_cloud_tokens": cfg.daily_cloud_tokens,
            "cloud_tokens_today": None if self._daily is None else self._daily.spent(self._wall()),
            # Today's spend could not be read from the store: the cloud is refused.
            "cloud_budget_unknown": daily is not None and daily.is_unknown(self._wall()),
            "requests": {o: c.value for o, c in self._outcomes.items()},
            "limited": {k: c.value for k, c in self._limited.items()},
        }


class _Count:
    """A counter child and its value, for /status (the client library keeps its own
    value private)."""

    __slots__ = ("_child", "value")

    def __init__(self, child: Counter) -> None:
        self._child = child
        self.value = 0

    def inc(self) -> None:
        self.value += 1
        add(self._child)


class KeyUse:
    """One request's hold on its key, from admission to its last byte."""

    __slots__ = ("_done", "budget_spent", "budget_unknown", "cloud", "key")

    def __init__(
        self,
        key: ClientKey,
        *,
        cloud: bool,
        budget_spent: bool = False,
        budget_unknown: bool = False,
    ) -> None:
        self.key = key
        self.cloud = cloud  # may this request reach a cloud provider
        self.budget_spent = budget_spent  # kept off the cloud by daily_cloud_tokens
        self.budget_unknown = budget_unknown  # ... because today's spend is unreadable
        self._done = False

    def count(self, entry: str, cloud: bool, prompt: int, completion: int) -> None:
        """Tokens of the answer from `entry` (a provider when `cloud`)."""
        self.key._count(entry, cloud, prompt, completion)

    def kept_off_cloud(self) -> None:
        """A chain passed over its providers because the key's daily cloud tokens are
        spent (counted in `key_limited_total{limit="daily_cloud_tokens"}`)."""
        if self.budget_spent:
            self.key._limited["daily_cloud_tokens"].inc()
            self.key._changed()

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The key's `x-ratelimit-*` headers for a response (none without rpm/tpm)."""
        return [(k.encode(), v.encode()) for k, v in self.key.rate_headers().items()]

    def finish(self, outcome: str) -> None:
        """The request ended (`served` or `error`); a second call does nothing."""
        if not self._done:
            self._done = True
            self.key._finished(outcome)


class KeyRing:
    def __init__(self, keys: Mapping[bytes, ClientKey], anonymous: ClientKey | None) -> None:
        self._by_digest = dict(keys)
        self.anonymous = anonymous  # None when keys are configured
        self.keys: tuple[ClientKey, ...] = tuple(keys.values()) or (
            (anonymous,) if anonymous is not None else ()
        )

    @classmethod
    def build(
        cls,
        api_keys: Iterable[str],
        keys_file: KeysConfig | None,
        metrics: KeyMetrics,
        entries: Iterable[str],
        *,
        environ: Mapping[str, str] = os.environ,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        on_change: Callable[[], None] | None = None,
    ) -> KeyRing:
        """The keys of `MICROSCHEDULER_API_KEYS` (no limits) and keys.yaml, their metrics
        declared for every entry (backend or provider) that may answer."""
        entries = tuple(entries)
        found: dict[bytes, ClientKey] = {}

        def add(name: str, digest: bytes, config: KeyConfig) -> None:
            if digest in found:  # also checked with the configuration (Settings)
                raise ValueError(f"keys {found[digest].name!r} and {name!r} share a secret")
            found[digest] = ClientKey(
                name, config, metrics, clock=clock, wall=wall, on_change=on_change
            )
            metrics.declare(name, entries)

        for index, secret in enumerate(api_keys, start=1):
            add(env_key_name(index), secret_digest(secret), _NO_LIMITS)
        for name, config in (keys_file.keys if keys_file is not None else {}).items():
            add(name, config.digest(environ), config)
        if found:
            return cls(found, None)
        metrics.declare(ANONYMOUS, entries)
        anonymous = ClientKey(
            ANONYMOUS, _NO_LIMITS, metrics, clock=clock, wall=wall, on_change=on_change
        )
        return cls({}, anonymous)

    def keeping(self, running: KeyRing) -> KeyRing:
        """This ring, with the running ring's key objects (their use, windows and daily
        budget) wherever a key kept its name, secret and settings (a config reload); a key
        that kept only its name carries today's cloud spend over."""
        found = {}
        by_name = {key.name: key for key in running._by_digest.values()}
        for digest, key in self._by_digest.items():
            before = running._by_digest.get(digest)
            same = before is not None and before.name == key.name and before.config == key.config
            if same and before is not None:
                found[digest] = before
                continue
            found[digest] = key
            if key.name in by_name:
                key.carry_cloud_spent(by_name[key.name])
        anonymous = self.anonymous
        if anonymous is not None and running.anonymous is not None:
            anonymous = running.anonymous
        return KeyRing(found, anonymous)

    def restore_cloud_spent(self, spent: Mapping[str, int], wall: float) -> None:
        """Today's cloud tokens per key name, as the store kept them (`app.store`)."""
        for key in self.keys:
            key.restore_cloud_spent(spent.get(key.name, 0), wall)

    def cloud_spent_unknown(self, wall: float) -> list[str]:
        """Today's spend could not be read: every key with `daily_cloud_tokens` is kept
        off the cloud (fail closed) until `restore_cloud_spent`; their names."""
        return [key.name for key in self.keys if key.cloud_spent_unknown(wall)]

    def identify(self, token: bytes) -> ClientKey | None:
        return self._by_digest.get(hashlib.sha256(token).digest())
