"""What a configuration reload changes: a pure function of the running settings and the
new ones (both already validated whole by `load_settings`), no I/O.

Backends, by what changed in their entry (and in the top-level `timeouts` they inherit):

- `unchanged`: left alone (streams go on, nothing restarts).
- `in_place`: its config object is replaced; everything that reads it reads it live
  (priority, lifecycle, idle_ttl_s, waits and queues, drain, release methods, aliases,
  role, replica group, vram_mib and the model description, max_inflight...), and the
  relay's connect/first-byte/idle timeouts are set on its upstream.
- `restart`: a setting fixed when its objects were built: the server (`url`, `runtime`:
  command, env, image...), where it runs (`host`, `gpus`), or its clients (`api_key_env`,
  `health_path`, `max_connections`, `timeouts.control_s`), or what it serves (`models`,
  `adapters`, `max_loras`, `runner`, `task`, `endpoints`, `sleep_mode`, `asleep_mib`).
  Its backend object is rebuilt: the old one drained and stopped, the new one started
  when pinned (a lazy one starts on its next request).
- `removed` (drained, stopped, unregistered) and `added` (registered; pinned ones started).

Top-level keys: `backends`, `cloud_providers.yaml` (providers, chains), `keys.yaml`, the
default `timeouts`, `allow_unauthenticated` and `notify` are applied. Any other key that
changed needs a restart: it is named in `restart_required` and the running value is kept
(`effective()`), e.g. `host`, `port`, `server`, `gpu`, `hosts`, `gpu_profiles.yaml`; so does
`keys.yaml` appearing or going away (whether model routes ask for a key is fixed at start).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from app.settings import LOCAL_HOST, BackendConfig, Settings

# Top-level keys a reload applies; a change to any other is reported, not applied.
APPLIED: Final = frozenset(
    {
        "backends",
        "cloud_providers",
        "client_keys",
        "timeouts",
        "allow_unauthenticated",
        "notify",
        "config_dir",
    }
)
# Backend keys whose change rebuilds the backend (and restarts its server).
RESTART_KEYS: Final = (
    "url",
    "runtime",
    "host",
    "gpus",
    "api_key_env",
    "health_path",
    "max_connections",
    "models",
    "adapters",
    "max_loras",
    "runner",
    "task",
    "endpoints",
    "sleep_mode",
    "asleep_mib",
)


@dataclass(frozen=True)
class ReloadPlan:
    """What a reload does, by backend name; `restart_required`: top-level keys that
    changed but are not applied (a restart of the gateway applies them); `problems`: why
    the new configuration cannot be applied to the running gateway (refused whole)."""

    unchanged: tuple[str, ...] = ()
    in_place: tuple[str, ...] = ()
    restart: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> keys
    removed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    restart_required: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.in_place or self.restart or self.removed or self.added)

    def summary(self) -> dict[str, Any]:
        return {
            "unchanged": list(self.unchanged),
            "updated": list(self.in_place),
            "restarted": sorted(self.restart),
            "removed": list(self.removed),
            "added": list(self.added),
            "restart_required": list(self.restart_required),
        }


def plan_reload(old: Settings, new: Settings) -> ReloadPlan:
    """The plan from `old` (running) to `new` (validated)."""
    restart_required = tuple(
        name
        for name in Settings.model_fields
        if (name not in APPLIED and getattr(old, name) != getattr(new, name))
        # Whether model routes ask for a key at all is fixed at start (the origin guard).
        or (name == "client_keys" and old.has_client_keys != new.has_client_keys)
    )
    unchanged, in_place, restart = [], [], {}
    for name, cfg in new.backends.items():
        before = old.backends.get(name)
        if before is None:
            continue
        keys = restart_keys(before, cfg)
        if old.backend_timeouts(name).control_s != new.backend_timeouts(name).control_s:
            keys = (*keys, "timeouts.control_s")
        if keys:
            restart[name] = keys
        elif before != cfg or old.backend_timeouts(name) != new.backend_timeouts(name):
            in_place.append(name)
        else:
            unchanged.append(name)
    removed = tuple(name for name in old.backends if name not in new.backends)
    added = tuple(name for name in new.backends if name not in old.backends)
    problems = (*_new_hosts(old, new, [*added, *restart]), *_kept_warm(old, removed))
    return ReloadPlan(
        unchanged=tuple(unchanged),
        in_place=tuple(in_place),
        restart=restart,
        removed=removed,
        added=added,
        restart_required=restart_required,
        problems=problems,
    )


def restart_keys(old: BackendConfig, new: BackendConfig) -> tuple[str, ...]:
    """The keys of RESTART_KEYS that differ between two configs of one backend."""
    return tuple(key for key in RESTART_KEYS if getattr(old, key) != getattr(new, key))


def _new_hosts(old: Settings, new: Settings, names: list[str]) -> list[str]:
    """A backend added or moved to a host the running gateway does not have: hosts are
    built at start (their GPU probe, arbiter and RAM book), so that needs a restart."""
    running = {LOCAL_HOST, *old.hosts}
    return [
        f"backends.{name}.host: host {new.backends[name].host_name!r} is not running in "
        "this gateway (a new host needs a restart)"
        for name in names
        if new.backends[name].gpus_accounted and new.backends[name].host_name not in running
    ]


def _kept_warm(old: Settings, removed: tuple[str, ...]) -> list[str]:
    """A removed backend that a running `keep_warm` window names: schedules change with a
    restart only, so the scheduler would go on naming a backend that is gone."""
    return [
        f"backends.{window.backend}: the running schedule {window.name!r} keeps it warm "
        "(schedules change with a restart: remove the window first, restart, then the backend)"
        for window in old.schedules
        if window.backend in removed
    ]


def effective(old: Settings, new: Settings, plan: ReloadPlan) -> Settings:
    """The settings the gateway runs with after the reload: the new ones, with the running
    value of every key that needs a restart."""
    if not plan.restart_required:
        return new
    return new.model_copy(update={key: getattr(old, key) for key in plan.restart_required})
