"""Fallback chains: which entries a request may go to, and the walk through them.

`build_cloud()` turns `cloud_providers.yaml` into a `Cloud`: the providers (those whose
key variable is set), one circuit per chain entry, and for every model id and alias the
chain it uses (the chain keyed by that name, else by its backend's role).

`ChainCall.open()` walks a chain for one request, in order:

1. Entries ruled out before anything is sent are passed over: a provider without its
   key (`no_api_key`), Anthropic for `/v1/completions` and `/v1/embeddings`
   (`unsupported_endpoint`), an open circuit (`circuit_open`), a half-open circuit whose
   one trial is out (`trial_in_flight`). If that leaves nothing, the answer is 503
   `all_entries_cooling` with `Retry-After` (when the first circuit may be tried again).
2. A local backend is acquired (woken if needed), waiting at most the chain's
   `wake_timeout_s` when entries remain after it (the start goes on for later requests)
   and what is left of the deadline otherwise. A refusal (stopped, blocked, yielded,
   disabled, no VRAM, queue full, failed) or a wake cut short moves on.
3. The upstream is opened with the smaller of its own first-byte timeout and what is
   left of the chain's `deadline_s`. `app.routing.policy.classify` judges what comes
   back before anything reaches the client: `serve` and `relay` end the walk, `next`
   goes on. A 200 stream whose first event is an error is judged `stream_error` (next).
4. Every outcome is reported to the entry's circuit. After the first byte the chain is
   done: a stream that breaks later ends with the in-band error (the relay's job), is
   reported to the circuit, and no other entry is asked.

Budgets: one deadline for the whole walk (`deadline_s`; the relay has no total timeout
afterwards) and at most `max_attempts` upstream requests. Local refusals and skips are
not attempts. The HTTP client never retries.

The answer carries `x-microscheduler-route` (the entry that answered) and
`x-microscheduler-fallbacks`: `0`, or the number of entries passed over and why,
`2; reasoning=local_stopped; deepseek=http_5xx`. A walk that finds no answer ends in 503
`fallback_exhausted` (504 `fallback_deadline` when the deadline cut it), whose
`error.tried` lists each entry and reason.

Visibility: `microscheduler_fallbacks_total` counts every fallback; the log line and the
`fallback` event (`on_event`, shown in `/status`) come at most every 30 s for the same
chain, entries and reason, with the number left out. Circuits log and emit
`circuit_open` / `circuit_closed` when they change. `describe()` is the `/status` view.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from app.errors import (
    AllEntriesCooling,
    FallbackDeadline,
    FallbackExhausted,
    GatewayError,
    UpstreamError,
    UpstreamTimeout,
    WakeTimeout,
)
from app.lifecycle.backend import Backend
from app.lifecycle.lease import WaitNotice
from app.metrics import Metrics
from app.routing.circuit import (
    ChainAvailability,
    Circuit,
    CircuitConfig,
    Circuits,
    CircuitState,
    Permit,
    available_entries,
)
from app.routing.dispatcher import Exchange
from app.routing.fallback_metrics import FallbackMetrics, TokenCounter
from app.routing.policy import (
    Budget,
    PolicyConfig,
    Verdict,
    classify_error,
    classify_response,
    first_byte_timeout,
)
from app.routing.registry import Registry, Route
from app.settings import Settings, TimeoutsConfig
from app.settings.cloud import ChainConfig, CloudConfig, ProviderConfig
from app.upstreams.anthropic.provider import AnthropicProvider, AnthropicStream
from app.upstreams.http import BufferedResponse, Relayable
from app.upstreams.openai_compat import OpenAIProvider
from app.upstreams.provider import Provider, ProviderRequest

logger = logging.getLogger(__name__)

EventHook = Callable[..., None]  # on_event(kind: str, **fields)

ROUTE_HEADER: Final = b"x-microscheduler-route"
FALLBACKS_HEADER: Final = b"x-microscheduler-fallbacks"
# Passed over without being asked: not fallbacks from one entry to the next.
_NOT_REACHED: Final = frozenset({"max_attempts", "deadline_unreached"})
# Skips that follow from the configuration: no event for them.
_STATIC_SKIPS: Final = frozenset({"no_api_key", "unsupported_endpoint"})
_STREAM_ERROR_STARTS: Final = (b'data: {"error"', b'data: {"object":"error"')
# The same fallback (chain, from, to, reason) is logged and recorded as an event at most
# this often; the next one carries how many were left out. A long outage or VRAM yield
# must not push everything else out of `/status`'s last 100 events.
FALLBACK_EVENT_EVERY_S: Final = 30.0


class Notice(Protocol):
    """The relay's keep-alive for a streaming client held while a backend wakes."""

    @property
    def started(self) -> bool: ...

    def for_backend(self, backend: str) -> WaitNotice: ...


@dataclass(frozen=True, slots=True)
class Chain:
    key: str  # the role, model id or alias it is configured under
    entries: tuple[str, ...]
    config: ChainConfig
    policy: PolicyConfig


@dataclass(frozen=True, slots=True)
class Passed:
    """An entry the walk passed over, and why (a verdict reason or a skip reason)."""

    entry: str
    reason: str
    detail: str | None = None  # our own message (never a provider body or a key)


class Cloud:
    """The providers, the chains and their circuits, built once per app."""

    def __init__(
        self,
        config: CloudConfig,
        providers: Mapping[str, Provider],
        backends: Mapping[str, Backend],
        chain_by_model: Mapping[str, Chain],
        metrics: Metrics,
        *,
        missing_keys: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.monotonic,
        on_event: EventHook | None = None,
    ) -> None:
        self.config = config
        self.providers = dict(providers)
        self.backends = backends
        self.chain_by_model = dict(chain_by_model)
        self.chains = {c.key: c for c in self.chain_by_model.values()}
        self.missing_keys = missing_keys
        self.clock = clock  # monotonic seconds; tests move it to age circuits
        self.on_event = on_event  # on_event(kind, **fields); set it any time
        self.upstream_errors = metrics.upstream_errors
        self.metrics = FallbackMetrics(metrics.registry)
        entries = sorted({e for chain in config.chains.values() for e in chain.entries})
        self.circuits = Circuits(
            _circuit_config(config, None),
            {name: _circuit_config(config, cfg) for name, cfg in config.providers.items()},
            entries,
        )
        self.metrics.declare(
            routes=[*backends, *config.providers],
            providers=config.providers,
            chains={key: chain.entries for key, chain in config.chains.items()},
            circuit_open={e: self._open_reader(self.circuits.get(e)) for e in entries},
        )
        self._excluded: dict[tuple[str, str], dict[str, str]] = {}
        self._fallback_seen: dict[tuple[str, str, str, str], tuple[float, int]] = {}

    def _open_reader(self, circuit: Circuit) -> Callable[[], float]:
        return lambda: 1.0 if circuit.state(self.clock()) is CircuitState.OPEN else 0.0

    def call(
        self,
        chain: Chain,
        route: Route,
        path: str,
        payload: dict[str, Any],
        stream: bool,
        route_body: bytes,
        headers: dict[str, str],
    ) -> ChainCall:
        """One request's walk; `route_body` is what the route's own backend gets."""
        return ChainCall(self, chain, route, path, payload, stream, route_body, headers)

    def excluded(self, chain: Chain, path: str) -> dict[str, str]:
        """Entries of `chain` ruled out for `path` by the configuration, with the reason."""
        key = (chain.key, path)
        found = self._excluded.get(key)
        if found is None:
            found = {}
            for entry in chain.entries:
                if entry in self.missing_keys:
                    found[entry] = "no_api_key"
                elif entry in self.providers and not self.providers[entry].supports(path):
                    found[entry] = "unsupported_endpoint"
            self._excluded[key] = found
        return found

    def emit(self, kind: str, **fields: Any) -> None:
        hook = self.on_event
        if hook is None:
            return
        try:
            hook(kind, **fields)
        except Exception:  # an observer must never break a request
            logger.exception("event hook failed kind=%s", kind)

    def fallback(self, chain: str, from_entry: str, to_entry: str, reason: str) -> None:
        """Count a fallback; log it and record an event, coalescing repeats."""
        self.metrics.fallback(chain, from_entry, to_entry, reason)
        if reason in _STATIC_SKIPS:
            return
        key = (chain, from_entry, to_entry, reason)
        now = self.clock()
        last, left_out = self._fallback_seen.get(key, (None, 0))
        if last is not None and now - last < FALLBACK_EVENT_EVERY_S:
            self._fallback_seen[key] = (last, left_out + 1)
            return
        self._fallback_seen[key] = (now, 0)
        logger.info(
            "fallback chain=%s from=%s to=%s reason=%s repeats=%d",
            chain, from_entry, to_entry, reason, left_out,
        )  # fmt: skip
        self.emit(
            "fallback", chain=chain, from_entry=from_entry, to_entry=to_entry, reason=reason,
            repeats=left_out,
        )  # fmt: skip

    def record(self, entry: str, permit: Permit, verdict: Verdict) -> None:
        """Report a verdict to the entry's circuit; log and emit when it opens or closes."""
        circuit = self.circuits.get(entry)
        now = self.clock()
        before = circuit.state(now)
        circuit.record(permit, verdict, now)
        self._transition(circuit, before, now, verdict.reason)

    def record_failure(self, entry: str, permit: Permit, reason: str) -> None:
        circuit = self.circuits.get(entry)
        now = self.clock()
        before = circuit.state(now)
        circuit.record_failure(permit, now, reason)
        self._transition(circuit, before, now, reason)

    def release(self, entry: str, permit: Permit) -> None:
        self.circuits.get(entry).release(permit, self.clock())

    def _transition(self, circuit: Circuit, before: CircuitState, now: float, reason: str) -> None:
        after = circuit.state(now)
        if after is CircuitState.OPEN and before is not CircuitState.OPEN:
            retry_in = circuit.snapshot(now).retry_in_s
            logger.warning(
                "circuit open entry=%s reason=%s retry_in_s=%.1f", circuit.entry, reason, retry_in
            )
            self.emit("circuit_open", entry=circuit.entry, reason=reason, retry_in_s=retry_in)
        elif after is CircuitState.CLOSED and before is not CircuitState.CLOSED:
            logger.info("circuit closed entry=%s", circuit.entry)
            self.emit("circuit_closed", entry=circuit.entry)

    def describe(self) -> dict[str, Any]:
        """Providers, circuits and chains for `/status`. Holds no key, only whether it is set."""
        now, wall = self.clock(), time.time()
        providers = {
            name: {
                "kind": cfg.kind,
                "base_url": cfg.base_url,
                "model": cfg.model,
                "api_key_env": cfg.api_key_env,
                "key_present": cfg.api_key_env is None or name not in self.missing_keys,
                "active": name in self.providers,
            }
            for name, cfg in self.config.providers.items()
        }
        circuits = {}
        for entry, snap in self.circuits.snapshot(now).items():
            circuits[entry] = {
                "state": snap.state.value,
                "failures": snap.consecutive_failures,
                "open_until": None
                if snap.open_until is None
                else round(wall + snap.open_until - now, 3),
                "retry_in_s": round(snap.retry_in_s, 3),
                "last_reason": snap.last_reason,
                "trial_in_flight": snap.trial_in_flight,
            }
        chains = {
            key: {
                "entries": list(chain.entries),
                "models": sorted(m for m, c in self.chain_by_model.items() if c.key == key),
                "on_context_length": chain.config.on_context_length,
                "wake_timeout_s": chain.config.wake_timeout_s,
                "deadline_s": chain.config.deadline_s,
                "max_attempts": chain.config.max_attempts,
            }
            for key, chain in ((k, self.chains.get(k)) for k in self.config.chains)
            if chain is not None
        }
        return {"providers": providers, "circuits": circuits, "chains": chains}

    async def close(self) -> None:
        for provider in self.providers.values():
            await provider.close()


def _circuit_config(config: CloudConfig, provider: ProviderConfig | None) -> CircuitConfig:
    base = config.circuit
    cooldown = base.cooldown_s
    if provider is not None and provider.cooldown_s is not None:
        cooldown = provider.cooldown_s
    return CircuitConfig(
        failure_threshold=base.failure_threshold,
        cooldown_s=cooldown,
        backoff=base.backoff,
        max_cooldown_s=max(base.max_cooldown_s, cooldown),
    )


def build_cloud(
    settings: Settings,
    registry: Registry,
    backends: Mapping[str, Backend],
    metrics: Metrics,
    *,
    environ: Mapping[str, str] | None = None,
    on_event: EventHook | None = None,
) -> Cloud:
    """The `Cloud` of `settings.cloud_providers` (an empty one without the file).

    A provider whose `api_key_env` is unset or empty is left out with a warning; the
    chains skip it (`no_api_key`) and `describe()` shows `key_present: false`."""
    config = settings.cloud_providers or CloudConfig()
    environ = os.environ if environ is None else environ
    providers: dict[str, Provider] = {}
    missing: set[str] = set()
    for name, cfg in config.providers.items():
        key = environ.get(cfg.api_key_env, "") if cfg.api_key_env else None
        if cfg.api_key_env and not key:
            missing.add(name)
            logger.warning(
                "provider skipped: its key variable is unset provider=%s variable=%s",
                name,
                cfg.api_key_env,
            )
            continue
        timeouts = _provider_timeouts(settings.timeouts, cfg)
        provider_type = AnthropicProvider if cfg.kind == "anthropic" else OpenAIProvider
        providers[name] = provider_type(name, cfg, key, timeouts)
    chains = {
        key: Chain(
            key,
            tuple(cfg.entries),
            cfg,
            PolicyConfig(
                on_context_length=cfg.on_context_length,
                fallback_on_status=frozenset(cfg.fallback_on_status),
                auth_cooldown_s=cfg.auth_cooldown_s,
            ),
        )
        for key, cfg in config.chains.items()
    }
    chain_by_model: dict[str, Chain] = {}
    for entry in registry.entries:
        role = settings.backends[entry.backend].role
        chain = chains.get(entry.id) or (chains.get(role) if role else None)
        if chain is not None:
            chain_by_model[entry.id] = chain
    for key in chains.keys() - {c.key for c in chain_by_model.values()}:
        logger.warning("chain unused: no model name resolves to it chain=%s", key)
    return Cloud(
        config,
        providers,
        backends,
        chain_by_model,
        metrics,
        missing_keys=frozenset(missing),
        on_event=on_event,
    )


def _provider_timeouts(base: TimeoutsConfig, cfg: ProviderConfig) -> TimeoutsConfig:
    update: dict[str, float] = {}
    if cfg.timeout_s is not None:
        update["connect_s"] = update["idle_s"] = cfg.timeout_s
    if cfg.first_byte_timeout_s is not None:
        update["first_byte_s"] = cfg.first_byte_timeout_s
    return base.model_copy(update=update)


def fallbacks_header(passed: list[Passed]) -> bytes:
    """`0`, or how many entries were passed over and why: `2; a=local_stopped; b=http_5xx`."""
    if not passed:
        return b"0"
    reasons = "; ".join(f"{p.entry}={p.reason}" for p in passed)
    return f"{len(passed)}; {reasons}".encode()


class ChainCall:
    """One request's walk through its chain (see the module docstring)."""

    def __init__(
        self,
        cloud: Cloud,
        chain: Chain,
        route: Route,
        path: str,
        payload: dict[str, Any],
        stream: bool,
        route_body: bytes,
        headers: dict[str, str],
    ) -> None:
        self._cloud = cloud
        self._chain = chain
        self._route = route
        self._path = path
        self._request = ProviderRequest(path, payload, stream)
        self._route_body = route_body
        self._headers = headers
        self._passed: list[Passed] = []
        self._attempts = 0

    async def open(self, notice: Notice | None = None) -> Exchange:
        cloud, chain = self._cloud, self._chain
        start = cloud.clock()
        budget = Budget.start(start, chain.config.deadline_s, chain.config.max_attempts)
        excluded = cloud.excluded(chain, self._path)
        plan = available_entries(chain.entries, cloud.circuits, start, excluded=excluded)
        if not plan.available:
            raise self._nothing_available(plan)
        skips = {s.entry: s.reason for s in plan.skipped}
        entries = chain.entries
        for index, entry in enumerate(entries):
            skip = skips.get(entry)
            if skip is not None:
                self._passed.append(Passed(entry, skip))
                continue
            now = cloud.clock()
            if not budget.allows_attempt(now, self._attempts):
                why = "max_attempts" if now < budget.deadline else "deadline_unreached"
                self._passed.extend(Passed(e, why) for e in entries[index:])
                break
            permit = cloud.circuits.get(entry).acquire(now)
            if permit is None:  # the trial went to another request meanwhile
                self._passed.append(Passed(entry, "trial_in_flight"))
                continue
            last = all(e in skips for e in entries[index + 1 :])
            if entry in cloud.providers:
                outcome = await self._provider(entry, permit, budget)
            else:
                outcome = await self._local(entry, permit, budget, notice, last)
            if isinstance(outcome, Exchange):
                self._count_fallbacks(outcome.backend)
                return outcome
            self._passed.append(outcome)
            if outcome.reason == "deadline":
                self._passed.extend(Passed(e, "deadline_unreached") for e in entries[index + 1 :])
                break
        self._count_fallbacks(None)
        raise self._exhausted()

    # -- one entry ----------------------------------------------------------------------

    async def _local(
        self, name: str, permit: Permit, budget: Budget, notice: Notice | None, last: bool
    ) -> Exchange | Passed:
        cloud = self._cloud
        backend = cloud.backends[name]
        remaining = budget.remaining(cloud.clock())
        wait = remaining if last else min(self._chain.config.wake_timeout_s, remaining)
        on_wait = notice.for_backend(name) if notice is not None else None
        try:
            lease = await backend.acquire(on_wait, max_wait_s=wait)
        except GatewayError as err:
            verdict = classify_error(err)
            if isinstance(err, WakeTimeout) and wait < backend.config.max_wait_s:
                # The chain's impatience, not the backend's failure: its start goes on.
                verdict = Verdict("next", "local_wake_timeout")
            if verdict.action == "relay":
                cloud.release(name, permit)
                raise
            cloud.record(name, permit, verdict)
            return Passed(name, verdict.reason, err.message)
        except BaseException:
            cloud.release(name, permit)
            raise
        if name == self._route.backend:
            body = self._route_body
        else:
            body = self._request.body_for(backend.config.served_model)
        upstream = backend.upstream
        first_byte = first_byte_timeout(budget, cloud.clock(), upstream.timeouts.first_byte_s)
        self._attempts += 1
        try:
            response = await upstream.open(self._path, body, self._headers, first_byte_s=first_byte)
        except UpstreamError as err:
            lease.release()
            cloud.upstream_errors.labels(name, err.kind).inc()
            return self._raised(name, permit, err, first_byte < upstream.timeouts.first_byte_s)
        except BaseException:
            lease.release()
            cloud.release(name, permit)
            raise
        if response.status >= 500:
            cloud.upstream_errors.labels(name, "http_5xx").inc()
        verdict = self._verdict(response)
        cloud.record(name, permit, verdict)
        if verdict.action == "next":
            response.release()
            lease.release()
            return Passed(name, verdict.reason, f"HTTP {response.status}")
        hooks = _Hooks(cloud, name, permit, provider=False, served=verdict.action == "serve")
        return Exchange(
            self._route,
            name,
            response,
            lease,
            headers=self._answer_headers(name),
            tokens=cloud.metrics.token_counter(name),
            hooks=hooks,
        )

    async def _provider(self, name: str, permit: Permit, budget: Budget) -> Exchange | Passed:
        cloud = self._cloud
        provider = cloud.providers[name]
        own = provider.first_byte_s
        first_byte = first_byte_timeout(budget, cloud.clock(), own)
        self._attempts += 1
        try:
            response = await provider.open(self._request, first_byte)
        except UpstreamError as err:
            passed = self._raised(name, permit, err, first_byte < own)
            cloud.metrics.provider_outcome(name, _outcome(passed.reason))
            return passed
        except GatewayError:  # the request cannot be put in this provider's terms: a 400
            cloud.release(name, permit)
            cloud.metrics.provider_outcome(name, "client_error")
            raise
        except BaseException:
            cloud.release(name, permit)
            raise
        verdict = self._verdict(response)
        cloud.record(name, permit, verdict)
        if verdict.action == "next":
            response.release()
            cloud.metrics.provider_outcome(name, verdict.reason)
            return Passed(name, verdict.reason, f"HTTP {response.status}")
        if verdict.action == "relay":
            cloud.metrics.provider_outcome(name, "client_error")
        counted = isinstance(response, AnthropicStream)  # its usage comes from the translator
        return Exchange(
            self._route,
            name,
            response,
            None,
            headers=self._answer_headers(name),
            tokens=None if counted else cloud.metrics.token_counter(name),
            hooks=_Hooks(cloud, name, permit, provider=True, served=verdict.action == "serve"),
        )

    def _raised(self, entry: str, permit: Permit, err: UpstreamError, cut: bool) -> Passed:
        """A transport failure: a timeout the deadline caused is the chain's, not the entry's."""
        cloud = self._cloud
        if cut and isinstance(err, UpstreamTimeout) and err.kind == "first_byte_timeout":
            cloud.release(entry, permit)
            return Passed(entry, "deadline", err.message)
        verdict = classify_error(err)
        cloud.record(entry, permit, verdict)
        return Passed(entry, verdict.reason, err.message)

    def _verdict(self, response: Relayable) -> Verdict:
        if response.status == 200 and response.is_event_stream and _early_error(response):
            return Verdict("next", "stream_error", counts_as_failure=True)
        body = (
            response.policy_body if isinstance(response, BufferedResponse) else response.first_chunk
        )
        return classify_response(
            response.status, response.headers, body, self._chain.policy, now=time.time()
        )

    # -- answers --------------------------------------------------------------------------

    def _answer_headers(self, entry: str) -> list[tuple[bytes, bytes]]:
        return [(ROUTE_HEADER, entry.encode()), (FALLBACKS_HEADER, fallbacks_header(self._passed))]

    def _count_fallbacks(self, answered: str | None) -> None:
        reached = [p for p in self._passed if p.reason not in _NOT_REACHED]
        targets = [p.entry for p in reached[1:]] + ([answered] if answered is not None else [])
        cloud, key = self._cloud, self._chain.key
        for passed, target in zip(reached, targets, strict=False):
            cloud.fallback(key, passed.entry, target, passed.reason)

    def _tried(self) -> list[tuple[str, str]]:
        return [(p.entry, p.reason) for p in self._passed]

    def _summary(self) -> str:
        parts = []
        for p in self._passed:
            detail = f"{p.detail} " if p.detail else ""
            parts.append(f"{p.entry}: {detail}({p.reason})")
        return "; ".join(parts)

    def _nothing_available(self, plan: ChainAvailability) -> GatewayError:
        self._passed = [Passed(s.entry, s.reason) for s in plan.skipped]
        headers = {FALLBACKS_HEADER.decode(): fallbacks_header(self._passed).decode()}
        what = f"the fallback chain {self._chain.key!r} of model {self._route.name!r}"
        if plan.retry_after_s is None:
            return FallbackExhausted(
                f"No entry of {what} can serve {self._path}: {self._summary()}.",
                tried=self._tried(),
                headers=headers,
            )
        return AllEntriesCooling(
            f"Every entry of {what} is cooling down after failures; retry in "
            f"{plan.retry_after_s}s: {self._summary()}.",
            tried=self._tried(),
            retry_after_s=plan.retry_after_s,
            headers=headers,
        )

    def _exhausted(self) -> GatewayError:
        cloud, chain = self._cloud, self._chain
        headers = {FALLBACKS_HEADER.decode(): fallbacks_header(self._passed).decode()}
        what = f"the fallback chain {chain.key!r} of model {self._route.name!r}"
        if any(p.reason == "deadline_unreached" or p.reason == "deadline" for p in self._passed):
            return FallbackDeadline(
                f"No entry of {what} answered within its deadline_s "
                f"({chain.config.deadline_s:g}s): {self._summary()}.",
                tried=self._tried(),
                headers=headers,
            )
        later = available_entries(
            chain.entries, cloud.circuits, cloud.clock(), excluded=cloud.excluded(chain, self._path)
        )
        return FallbackExhausted(
            f"No entry of {what} could answer: {self._summary()}.",
            tried=self._tried(),
            retry_after_s=later.retry_after_s,
            headers=headers,
        )


def _early_error(response: Relayable) -> bool:
    if isinstance(response, AnthropicStream):
        return response.early_error
    return response.first_chunk.lstrip().startswith(_STREAM_ERROR_STARTS)


def _outcome(reason: str) -> str:
    return "timeout" if reason == "deadline" else reason


class _Hooks:
    """After the first byte: a broken stream reaches the circuit; provider outcomes and
    translated usage are counted when the exchange ends."""

    __slots__ = ("_cloud", "_entry", "_failed", "_permit", "_provider", "_served")

    def __init__(
        self, cloud: Cloud, entry: str, permit: Permit, *, provider: bool, served: bool
    ) -> None:
        self._cloud = cloud
        self._entry = entry
        self._permit = permit
        self._provider = provider
        self._served = served
        self._failed = False

    def stream_failed(self, exchange: Exchange, error: UpstreamError) -> None:
        self._failed = True
        self._cloud.record_failure(self._entry, self._permit, "stream_error")

    def finished(self, exchange: Exchange) -> None:
        response = exchange.response
        if isinstance(response, AnthropicStream):
            if response.failed and not self._failed:
                # An error event after the first content: relayed in-band, counted here.
                self._failed = True
                self._cloud.record_failure(self._entry, self._permit, "stream_error")
            counter: TokenCounter = self._cloud.metrics.token_counter(self._entry)
            counter.add(*response.usage())
        if not (self._provider and self._served):
            return
        if self._failed:
            outcome = "stream_error"
        elif exchange.completed:
            outcome = "ok"
        else:
            outcome = "cancelled"
        self._cloud.metrics.provider_outcome(self._entry, outcome)
