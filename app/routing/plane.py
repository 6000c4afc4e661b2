"""The routing plane: what a request is routed, authorised and accounted with, built from
one configuration by one function (`build_plane`), at start and for every reload, after
llama-swap's single `Router`.

- `registry` (names to routes), `cloud` (providers, chains, circuits), `keys` and `auth`
  (the client keys and who may ask what) and `dispatcher` (where a call goes) are built
  together from one `Settings` and held by one frozen `RoutingPlane`.
- A reload builds the next plane from the running one (`running=`): it keeps what must
  outlive a configuration (the dispatcher's response ids and replica picks, the keys
  whose name, secret and settings stayed, the cloud when its inputs did not change; a
  new cloud keeps the fallback counters) and replaces the running plane in one assignment
  (`Services.plane`, `app.reload.apply`).
- A request reads the plane once (`app.api.deps.plane_of`) and is routed, authorised
  and accounted with that one, whatever a reload swaps while it runs.

What belongs to one backend (its LoRA adapters, `Backend.adapters`) lives on it, not here:
a plane holds no per-backend state a reload would have to carry over. The backends are
read live by name (a rebuilt backend's new object is found under its name).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from app.access.auth import Authenticator
from app.access.origins import OriginPolicy
from app.events import EventLog
from app.keys.metrics import KeyMetrics
from app.keys.ring import KeyRing
from app.metrics import Metrics
from app.routing.cloud import Cloud, EventHook, build_cloud
from app.routing.dispatcher import Dispatcher
from app.routing.rebuilds import Rebuilds
from app.routing.registry import Registry
from app.routing.responses import ResponseIds
from app.routing.routed import RoutedBackend
from app.settings import Settings
from app.upstreams.vllm_load import BackendLoad


@dataclass(frozen=True)
class PlaneInputs:
    """What every plane of one gateway is built over (the same objects at each build)."""

    backends: Mapping[str, RoutedBackend]  # the live table: a reload edits it in place
    metrics: Metrics
    key_metrics: KeyMetrics
    events: EventLog
    rebuilds: Rebuilds  # the backends a reload is rebuilding: requests wait
    load_of: Callable[[str], BackendLoad | None]  # a backend's last scraped vLLM load
    on_cloud_fallback: EventHook  # a request of a local model fell to a cloud provider


@dataclass(frozen=True)
class RoutingPlane:
    """One consistent routing snapshot: every part built from `settings`. `generation`
    counts the planes of this gateway (0: the start's; each reload's swap adds one)."""

    settings: Settings
    registry: Registry
    cloud: Cloud
    keys: KeyRing
    auth: Authenticator
    dispatcher: Dispatcher
    generation: int = 0


def build_plane(
    settings: Settings, inputs: PlaneInputs, running: RoutingPlane | None = None
) -> RoutingPlane:
    """The plane of `settings`; `running`: the plane it replaces (a reload), whose
    long-lived parts it keeps. Nothing running changes: the caller swaps it in."""
    registry = Registry.from_backends(settings.backends)
    cloud = _cloud(settings, inputs, registry, running)
    providers = settings.cloud_providers.providers if settings.cloud_providers else {}
    keys = KeyRing.build(
        (key.get_secret_value() for key in settings.api_keys),
        settings.client_keys,
        inputs.key_metrics,
        [*settings.backends, *providers],
        on_change=inputs.events.changed,
    )
    if running is not None:
        keys = keys.keeping(running.keys)
    dispatcher = Dispatcher(
        registry,
        inputs.backends,
        inputs.metrics,
        cloud,
        _response_ids(settings) if running is None else running.dispatcher.response_ids,
        load_of=inputs.load_of,
        replicas=None if running is None else running.dispatcher.replicas,
        rebuilds=inputs.rebuilds,
    )
    auth = Authenticator(keys, settings.admin_key, OriginPolicy.from_settings(settings))
    # The notifications' hooks (the events feed `notify:`).
    cloud.on_cloud_fallback = inputs.on_cloud_fallback
    for key in keys.keys:
        key.on_budget = inputs.events.record
    generation = 0 if running is None else running.generation + 1
    return RoutingPlane(settings, registry, cloud, keys, auth, dispatcher, generation)


def _cloud(
    settings: Settings, inputs: PlaneInputs, registry: Registry, running: RoutingPlane | None
) -> Cloud:
    """The running cloud when its inputs did not change (its circuits and sessions go on),
    else a new one (circuits closed) keeping the running one's fallback counters."""
    if running is not None and cloud_inputs(running.settings) == cloud_inputs(settings):
        return running.cloud
    return build_cloud(
        settings,
        registry,
        inputs.backends,
        inputs.metrics,
        on_event=inputs.events.record,
        fallback_metrics=None if running is None else running.cloud.metrics,
    )


def cloud_inputs(settings: Settings) -> tuple[object, ...]:
    """What the cloud is built from: rebuilt when any of it changed."""
    backends = {
        name: (tuple(cfg.names), cfg.role, cfg.replica_of, cfg.apis)
        for name, cfg in settings.backends.items()
    }
    return (settings.cloud_providers, settings.timeouts, backends)


def _response_ids(settings: Settings) -> ResponseIds:
    return ResponseIds(
        ttl_s=settings.responses_ttl_s,
        max_ids=settings.responses_max_ids,
        max_ids_per_key=settings.responses_max_ids_per_key,
    )
