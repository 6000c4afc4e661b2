"""The cloud side of fallback: providers, chains and their circuits, built once per app.

`build_cloud()` turns `cloud_providers.yaml` into a `Cloud`: the providers (those whose
key variable is set), one circuit per chain entry, and for every model id and alias the
chain it uses (the chain keyed by that name, else by its backend's role). The walk of one
request through its chain is `app.routing.chains.ChainCall`.

Visibility: `microscheduler_fallbacks_total` counts every fallback; the log line and the
`fallback` event (`on_event`, shown in `/status`) come at most every 30 s for the same
chain, entries and reason, with the number left out. Circuits log and emit
`circuit_open` / `circuit_closed` when they change. `status()` is what `/status` shows.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from app.keys.ring import ANONYMOUS, KeyUse
from app.metrics import Metrics
from app.routing.circuit import (
    Circuit,
    CircuitConfig,
    Circuits,
    CircuitSnapshot,
    CircuitState,
    Permit,
)
from app.routing.fallback_metrics import FallbackMetrics
from app.routing.policy import FallbackReason, PolicyConfig, Verdict
from app.routing.registry import Registry
from app.routing.routed import RoutedBackend
from app.settings import Settings, TimeoutsConfig
from app.settings.cloud import ChainConfig, CloudConfig, ProviderConfig
from app.settings.endpoints import Api
from app.upstreams.anthropic.provider import AnthropicProvider
from app.upstreams.openai_compat import OpenAIProvider
from app.upstreams.provider import Provider

logger = logging.getLogger(__name__)

EventHook = Callable[..., None]  # on_event(kind: str, **fields)

# Skips that follow from the configuration: no event for them.
_STATIC_SKIPS: Final = frozenset({FallbackReason.NO_API_KEY, FallbackReason.UNSUPPORTED_ENDPOINT})
# The same fallback (chain, from, to, reason) is logged and recorded as an event at most
# this often; the next one carries how many were left out. A long outage or VRAM yield
# must not push everything else out of `/status`'s last 100 events.
FALLBACK_EVENT_EVERY_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class ProviderStatus:
    kind: str
    base_url: str
    model: str
    api_key_env: str | None
    key_present: bool  # its key variable was set at start-up (or it needs none)
    active: bool  # built and used by the chains


@dataclass(frozen=True, slots=True)
class ChainStatus:
    entries: tuple[str, ...]
    models: tuple[str, ...]  # the model names that use it
    config: ChainConfig


@dataclass(frozen=True, slots=True)
class CloudStatus:
    providers: dict[str, ProviderStatus]
    circuits: dict[str, CircuitSnapshot]
    chains: dict[str, ChainStatus]
    wall_minus_clock: float  # add to a circuit's `open_until` for Unix time


@dataclass(frozen=True, slots=True)
class Chain:
    key: str  # the role, model id or alias it is configured under
    entries: tuple[str, ...]
    config: ChainConfig
    policy: PolicyConfig


class Cloud:
    """The providers, the chains and their circuits, built once per app."""

    def __init__(
        self,
        config: CloudConfig,
        providers: Mapping[str, Provider],
        backends: Mapping[str, RoutedBackend],
        chain_by_model: Mapping[str, Chain],
        metrics: Metrics,
        *,
        missing_keys: frozenset[str] = frozenset(),
        apis: Mapping[str, frozenset[Api]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_event: EventHook | None = None,
        groups: Mapping[str, tuple[str, ...]] | None = None,
        fallback_metrics: FallbackMetrics | None = None,
    ) -> None:
        """`apis`: what each entry serves (default: each backend's configuration and
        each provider's `supports`). `groups`: the replica groups, with their members."""
        self.config = config
        self.providers = dict(providers)
        self.backends = backends
        self.groups = dict(groups or {})
        self.chain_by_model = dict(chain_by_model)
        self.chains = {c.key: c for c in self.chain_by_model.values()}
        self.missing_keys = missing_keys
        # A provider's (or a backend's not built: its configuration's); a backend serves what
        # it says (`Backend.serving`, learned from its server).
        self.apis = (
            dict(apis)
            if apis is not None
            else {name: frozenset(a for a in Api if p.supports(a)) for name, p in providers.items()}
        )
        self.clock = clock  # monotonic seconds; tests move it to age circuits
        self.on_event = on_event  # on_event(kind, **fields); set it any time
        # A request answered by a provider after local entries were passed over (the
        # notifications: `fallback_to_cloud`, the first per key per hour); set any time.
        self.on_cloud_fallback: EventHook | None = None
        self.upstream_errors = metrics.upstream_errors
        # A cloud built again by a reload keeps the metrics (registered once per registry).
        self.metrics = fallback_metrics or FallbackMetrics(metrics.registry)
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
        self._fallback_seen: dict[tuple[str, str, str, FallbackReason], tuple[float, int]] = {}

    def _open_reader(self, circuit: Circuit) -> Callable[[], float]:
        return lambda: 1.0 if circuit.state(self.clock()) is CircuitState.OPEN else 0.0

    def excluded(self, chain: Chain, apis: tuple[Api, ...]) -> dict[str, FallbackReason]:
        """Entries of `chain` ruled out before anything is sent for a call that any of
        `apis` can serve (its own, then its translation), with the reason. Not cached: a
        backend's APIs change when its server says what it serves."""
        found: dict[str, FallbackReason] = {}
        for entry in chain.entries:
            if entry in self.missing_keys:
                found[entry] = FallbackReason.NO_API_KEY
            elif self._removed(entry):
                found[entry] = FallbackReason.LOCAL_DISABLED
            elif not any(self.serves(entry, api) for api in apis):
                found[entry] = FallbackReason.UNSUPPORTED_ENDPOINT
        return found

    def _removed(self, entry: str) -> bool:
        """Whether `entry` is a backend a reload removed since this cloud was built (a
        request keeps the routing plane it arrived on, `app.routing.plane`)."""
        known = (self.backends, self.providers, self.groups, self.apis)
        return not any(entry in names for names in known)

    def served_by(self, entry: str) -> frozenset[Api]:
        """What `entry` serves: a provider's APIs, a backend's (`Backend.serving`), a replica
        group's first member's (its members serve the same)."""
        members = self.groups.get(entry)
        name = members[0] if members else entry
        backend = self.backends.get(name)
        if backend is not None:
            return backend.serving.apis
        return self.apis.get(name, frozenset())

    def serves(self, entry: str, api: Api) -> bool:
        return api in self.served_by(entry)

    def emit(self, kind: str, **fields: Any) -> None:
        hook = self.on_event
        if hook is None:
            return
        try:
            hook(kind, **fields)
        except Exception:  # an observer must never break a request
            logger.exception("event hook failed kind=%s", kind)

    def fell_to_cloud(
        self, chain: str, provider: str, key: KeyUse | None, passed: list[str]
    ) -> None:
        hook = self.on_cloud_fallback
        if hook is None:
            return
        name = ANONYMOUS if key is None else key.key.name
        try:
            hook(key=name, chain=chain, provider=provider, passed=passed)
        except Exception:  # an observer must never break a request
            logger.exception("cloud fallback hook failed chain=%s", chain)

    def fallback(self, chain: str, from_entry: str, to_entry: str, reason: FallbackReason) -> None:
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

    def record_failure(self, entry: str, permit: Permit, reason: FallbackReason) -> None:
        circuit = self.circuits.get(entry)
        now = self.clock()
        before = circuit.state(now)
        circuit.record_failure(permit, now, reason)
        self._transition(circuit, before, now, reason)

    def release(self, entry: str, permit: Permit) -> None:
        self.circuits.get(entry).release(permit, self.clock())

    def _transition(
        self, circuit: Circuit, before: CircuitState, now: float, reason: FallbackReason
    ) -> None:
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

    def status(self) -> CloudStatus:
        """Providers, circuits and chains for `/status` (`app.api.views.fallback_view`).
        Holds no key, only whether it is set."""
        now = self.clock()
        providers = {
            name: ProviderStatus(
                kind=cfg.kind,
                base_url=cfg.base_url,
                model=cfg.model,
                api_key_env=cfg.api_key_env,
                key_present=cfg.api_key_env is None or name not in self.missing_keys,
                active=name in self.providers,
            )
            for name, cfg in self.config.providers.items()
        }
        chains = {
            key: ChainStatus(
                entries=chain.entries,
                models=tuple(sorted(m for m, c in self.chain_by_model.items() if c.key == key)),
                config=chain.config,
            )
            for key, chain in ((k, self.chains.get(k)) for k in self.config.chains)
            if chain is not None
        }
        return CloudStatus(providers, self.circuits.snapshot(now), chains, time.time() - now)

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
    backends: Mapping[str, RoutedBackend],
    metrics: Metrics,
    *,
    environ: Mapping[str, str] | None = None,
    on_event: EventHook | None = None,
    fallback_metrics: FallbackMetrics | None = None,
) -> Cloud:
    """The `Cloud` of `settings.cloud_providers` (an empty one without the file).

    A provider whose `api_key_env` is unset or empty is left out with a warning; the
    chains skip it (`no_api_key`) and `status()` shows `key_present: false`."""
    config = settings.cloud_providers or CloudConfig()
    providers, missing = _providers(settings, config, os.environ if environ is None else environ)
    chains = _chains(config)
    groups = _groups(settings)
    chain_by_model = _chain_by_model(settings, registry, chains, groups)
    return Cloud(
        config,
        providers,
        backends,
        chain_by_model,
        metrics,
        missing_keys=frozenset(missing),
        apis={name: cfg.apis for name, cfg in config.providers.items()}
        | {name: cfg.apis for name, cfg in settings.backends.items() if name not in backends},
        on_event=on_event,
        groups=groups,
        fallback_metrics=fallback_metrics,
    )


def _providers(
    settings: Settings, config: CloudConfig, environ: Mapping[str, str]
) -> tuple[dict[str, Provider], set[str]]:
    """The providers whose key is present, and the names of those left out without it."""
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
    return providers, missing


def _chains(config: CloudConfig) -> dict[str, Chain]:
    return {
        key: Chain(
            key,
            tuple(cfg.entries),
            cfg,
            PolicyConfig(
                on_context_length=cfg.on_context_length,
                fallback_on_status=frozenset(cfg.fallback_on_status),
                auth_cooldown_s=cfg.auth_cooldown_s,
                fallback_on=frozenset(cfg.fallback_on),
            ),
        )
        for key, cfg in config.chains.items()
    }


def _groups(settings: Settings) -> dict[str, tuple[str, ...]]:
    """Each replica group's members, in the configuration's order."""
    groups: dict[str, tuple[str, ...]] = {}
    for name, backend in settings.backends.items():
        if backend.replica_of is not None:
            groups[backend.replica_of] = (*groups.get(backend.replica_of, ()), name)
    return groups


def _chain_by_model(
    settings: Settings,
    registry: Registry,
    chains: Mapping[str, Chain],
    groups: Mapping[str, tuple[str, ...]],
) -> dict[str, Chain]:
    """The chain each model name walks (its own, else its backend's role's), with a
    warning for a chain that lists a group's member instead of the group, and for one
    that no name resolves to."""
    chain_by_model: dict[str, Chain] = {}
    for entry in registry.entries:
        role = settings.backends[entry.backend].role
        chain = chains.get(entry.id) or (chains.get(role) if role else None)
        if chain is not None:
            chain_by_model[entry.id] = chain
    warned = {
        (c.key, group)
        for c in chain_by_model.values()
        for group, members in groups.items()
        if group not in c.entries and any(m in c.entries for m in members)
    }
    for chain_key, group in sorted(warned):
        logger.warning(
            "chain lists a member of a replica group, not the group: that member is asked "
            "with no replica pick chain=%s group=%s",
            chain_key,
            group,
        )
    for key in chains.keys() - {c.key for c in chain_by_model.values()}:
        logger.warning("chain unused: no model name resolves to it chain=%s", key)
    return chain_by_model


def _provider_timeouts(base: TimeoutsConfig, cfg: ProviderConfig) -> TimeoutsConfig:
    update: dict[str, float] = {}
    if cfg.timeout_s is not None:
        update["connect_s"] = update["idle_s"] = cfg.timeout_s
    if cfg.first_byte_timeout_s is not None:
        update["first_byte_s"] = cfg.first_byte_timeout_s
    return base.model_copy(update=update)
