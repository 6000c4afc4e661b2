"""JSON views of the control plane's typed results: the one place they become dicts.

Domain objects answer dataclasses (a `Zone`, a `YieldOutcome`, a `ProfileActivation`,
a `GpuStatus`...) or are read directly (a `Backend`); the routes render them here, so a
field's JSON name and rounding are decided once.
"""

from __future__ import annotations

import time
from typing import Any

from app.api.sleeps import sleeps_view
from app.gpu.poller import GpuStatus
from app.gpu.telemetry import MIB, GpuStats
from app.lifecycle.load import LoadStatus
from app.lifecycle.memory import NOT_PLACED
from app.lifecycle.state import BackendState
from app.lifecycle.view import BackendView
from app.planner.footprint import Footprint
from app.routing.circuit import CircuitSnapshot
from app.routing.cloud import CloudStatus
from app.runtimes.output import OutputSource
from app.services import Services
from app.settings import ReleaseConfig
from app.upstreams.vllm_output import CompileSeen
from app.vram.host_ram import HostRamView
from app.vram.hosts import Host
from app.vram.residency import protected_for_s
from app.vram.yield_answers import HoldReleased, RestoreReport, YieldOutcome
from app.vram.zones import Hold, Zone

Json = dict[str, Any]

# -- backends ----------------------------------------------------------------------------


def backend_view(backend: BackendView) -> Json:
    cfg = backend.config
    return {
        "name": backend.name,
        "state": str(backend.state),
        "reason": backend.reason,
        # A pinned backend that is down: seconds until the watch starts it again.
        "restart_in_s": _seconds(backend.restart_in_s),
        "starting": backend.start_progress(),  # while starting: what it waits for
        # While starting: vLLM's phase, the share done, seconds left by its last start.
        "load": load_view(backend.load()),
        "lifecycle": cfg.lifecycle,
        "replica_of": cfg.replica_of,  # its replica group (None: not a replica)
        # What requests may use it for: endpoints:, else what its server's /openapi.json
        # listed, else its task: or runner: (`apis_from`), and its learned max_model_len.
        "apis": sorted(backend.serving.apis),
        "apis_from": backend.serving.source,
        "max_model_len": backend.serving.max_model_len,
        "runtime": backend.runtime.describe(),
        # Whether the gateway starts and stops it (an external server is only checked),
        # and whether it can read the server's output (`GET /backends/{name}/logs`).
        "managed": backend.runtime.managed,
        "output": isinstance(backend.runtime, OutputSource),
        "runtime_detail": backend.runtime_detail,
        "priority": cfg.priority,
        "in_flight": backend.in_flight,
        "waiting": backend.waiting,  # held: until it is ready, or for a slot
        "queued": backend.queued,  # of those, for a slot (max_inflight in flight)
        "max_inflight": cfg.max_inflight,
        "pool_waiting": backend.upstream.pool_waiting,  # for a free connection (max_connections)
        "idle_s": round(backend.idle_s(), 1),
        "idle_ttl_s": cfg.idle_ttl_s,
        # Seconds until its idle stop (None: pinned, no idle_ttl_s, not ready, or busy).
        "idle_stop_in_s": _seconds(backend.idle_stop_in_s()),
        "min_resident_s": cfg.min_resident_s,
        # While it lasts, the seconds left: another model's start waits, not evicts it.
        "protected_for_s": round(protected_for_s(backend), 1) or None,
        "last_start_s": (None if backend.last_start_s is None else round(backend.last_start_s, 3)),
        # Its last start's torch.compile: `compile_s` and `compile_cache` (hit, miss, off).
        "last_compile": compile_view(backend.last_compile),
        "healthy": backend.healthy,
        "health_error": backend.health_error,
        # The last failure to reach it, in full (address, exception): clients get a summary.
        "upstream_error": backend.upstream.last_error,
        "vram_mib": backend.vram_mib,
        # The machine whose GPUs it uses; None: a kubernetes backend the cluster places.
        "host": cfg.host_name if cfg.gpus_accounted else None,
        # Where it sits: `gpus`, `last_gpus`, `placement`, `placed_why` (`placement_view`).
        **placement_view(backend),
        "holds_vram": backend.holds_vram,
        # MiB per GPU it holds now (None: none): asleep, what it kept; else what its last
        # start measured, else what admission counts. `ps` and `status` show this.
        "held_mib": backend.held_mib,
        "blocked_by": sorted(backend.blocks.values()),
        "yield_method": backend.yield_method,
        # How an idle stop and an eviction free its memory (stop, or sleep at a level;
        # `auto`: the deepest level it may go, level 1 within the host RAM budget).
        # `action`: what its idle stop will do, as far as its config says (the countdown
        # is `idle_stop_in_s` either way): sleep, stop, or `sleep or stop` for `auto` at
        # level 1 (level 1 when it fits the host RAM budget, else stop).
        "idle": {
            "method": cfg.idle.method,
            "level": cfg.idle.sleep_level,
            "action": idle_action(
                cfg.idle, sleeps=backend.sleep_supported, managed=backend.runtime.managed
            ),
        },
        "eviction": {"method": cfg.eviction.method, "level": cfg.eviction.sleep_level},
        "sleep_mode": backend.sleep_supported,
        # Asleep: the MiB per GPU it still holds, as admission counts them (else None),
        # and the level it sleeps at (None: awake, or not known).
        "asleep_mib": backend.asleep_mib,
        "asleep_level": backend.asleep_level,
        # The host RAM its weights take asleep at level 1 (MiB), and where that is from:
        # measured (vLLM's load), model (the planner's weights) or vram_mib.
        "host_ram_charge_mib": backend.ram_charge[0],
        "host_ram_charge_from": backend.ram_charge[1],
        "sleeps": sleeps_view(backend.sleeps, backend.config.sleep_leak_mib),  # the sleep guard
    }


def placement_view(backend: BackendView) -> Json:
    """Where a backend sits, in `/status` and `/backends`:

    - `gpus`: the GPUs it holds memory on now (running, starting once admitted, asleep
      with what it keeps); `[]` while it holds none (stopped, failed, waiting for room);
    - `last_gpus`: where it runs now or ran last (a `gpus:` list: that list, from the
      start); null for `gpus: auto` or a count before its first start placed it;
    - `placement`: its `gpus:` as configured: `auto`, a count (chosen at each start by its
      host's `gpu.placement:`) or the list;
    - `placed_why`: why it went there ("GPU 1: 18.2 GiB free, pack").

    A kubernetes backend without `host:` (the cluster places it): `[]`, null, null and
    what says so."""
    cfg = backend.config
    if not cfg.gpus_accounted:
        why = "placed by the cluster's scheduler (no host:)"
        return {"gpus": [], "last_gpus": None, "placement": None, "placed_why": why}
    placed = cfg.fixed_gpus is not None or backend.placed_why != NOT_PLACED
    return {
        "gpus": list(backend.gpus) if backend.holds_vram else [],
        "last_gpus": list(backend.gpus) if placed else None,
        "placement": cfg.gpus,
        "placed_why": backend.placed_why,
    }


def idle_action(how: ReleaseConfig, *, sleeps: bool, managed: bool) -> str:
    """What an idle stop does to a backend (`app.lifecycle.release.choose_release`'s
    rules, before the host RAM is known): `sleep`, `stop` or `sleep or stop`."""
    if not managed or how.method == "stop" or not sleeps:
        return "stop"
    if how.method == "auto" and how.sleep_level == 1:
        return "sleep or stop"
    return "sleep"


def load_view(load: LoadStatus | None) -> Json | None:
    if load is None:
        return None
    view: Json = {"phase": load.phase, "percent": load.percent, "eta_s": load.eta_s}
    return view | compile_view(load.compile)


def compile_view(seen: CompileSeen | None) -> Json:
    """A start's torch.compile: `compile_s` and `compile_cache` (`hit`, `miss`, `off`; null
    until vLLM says): a cold start with a warm cache shows `hit` and a short compile."""
    if seen is None:
        return {"compile_s": None, "compile_cache": None}
    seconds = None if seen.seconds is None else round(seen.seconds, 2)
    return {"compile_s": seconds, "compile_cache": seen.cache}


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def backend_vram_view(backend: BackendView, profile_mib: int | None) -> Json:
    """A backend's memory in `/status`: configured, the profile's share, what admission
    counts (and how it was planned), and what its last start measured."""
    footprint = backend.footprint
    return {
        "configured_mib": backend.config.vram_mib,
        "profile_mib": profile_mib,
        "admission_mib": backend.vram_mib,
        "footprint": None if footprint is None else footprint_view(footprint),
        "measured_mib": backend.measured_mib,
    }


def ready_view(backend: BackendView) -> Json:
    return {
        "ready": backend.state is BackendState.READY and backend.healthy is True,
        "lifecycle": backend.config.lifecycle,
        "state": str(backend.state),
        "healthy": backend.healthy,
        "reason": backend.reason,
        "health_error": backend.health_error,
    }


# -- zones and the yield -----------------------------------------------------------------


def zone_view(zone: Zone) -> Json:
    return {
        "zone": zone.name,
        "holder": zone.holder,
        "host": zone.host,
        "gpu": zone.gpu,
        "mib": zone.mib,
        "granted_at": zone.granted_at,
        "expires_at": zone.expires_at,
        "kind": zone.kind,
        "blocks": list(zone.blocks),
    }


def hold_view(hold: Hold) -> Json:
    return {
        "reason": hold.holder,
        "granted_at": hold.granted_at,
        "expires_at": hold.expires_at,
        "expires_in_s": expires_in_s(hold.expires_at),
    }


def yield_view(zone: Zone | None) -> Json:
    """`GET /vram/yield`: the yield that holds, as measured when it was taken (`reason`:
    the first holder's), and its holds (`holds`; `holders`: their reasons). `expires_at`:
    when the last hold ends by itself (None: one never does)."""
    if zone is None:
        return {"state": "none"}
    report = {} if zone.report is None else zone.report.to_json()
    return {
        "state": "yielded",
        "host": zone.host,
        **report,
        "held_mib": zone.mib,
        "granted_at": zone.granted_at,
        "expires_at": zone.expires_at,
        "holders": list(zone.holders),
        "holds": [hold_view(h) for h in zone.holds],
    }


def yield_outcome_view(outcome: YieldOutcome) -> Json:
    """`POST /vram/yield`: the yield, and whether it held already before this call;
    `reason` and `expires_at` are the caller's own hold's (`hold`)."""
    hold = outcome.hold
    return {
        **yield_view(outcome.zone),
        "already": outcome.already,
        "reason": hold.holder,
        "expires_at": hold.expires_at,
        "hold": hold_view(hold),
    }


def restore_view(report: RestoreReport | HoldReleased | None, host: str) -> Json:
    if report is None:
        return {"state": "none", "restored": False, "host": host}
    if isinstance(report, HoldReleased):  # others hold on: the yield holds still
        zone = report.zone
        return {
            "state": "yielded",
            "restored": False,
            "host": host,
            "reason": report.holder,
            "released": report.released,
            "holders": list(zone.holders),
            "holds": [hold_view(h) for h in zone.holds],
        }
    return {
        "state": "restored",
        "restored": True,
        "host": host,
        "reason": report.reason,
        "why": report.why,
        "order": list(report.order),
        "back": list(report.back),
        "starting": list(report.starting),
        "failed": dict(report.failed),
        "on_demand": list(report.on_demand),
        "yielded_for_s": report.yielded_for_s,
        "ended": list(report.ended),
    }


# -- GPUs ----------------------------------------------------------------------------------

NO_GPU_STATUS: Json = {
    "source": "none",
    "up": False,
    "error": "gpu.probe is none: no GPU telemetry, VRAM admission is off",
    "gpus": [],
}


def gpu_status_view(
    status: GpuStatus | None, *, probe: str | None = None, warning: str | None = None
) -> Json:
    """The GPU section of `/status` (None: `gpu.probe: none`). `probe` is the probe running
    (`auto` resolved: nvml or none); `warning` says why there is none when `auto` found no
    GPU (the page shows it as a banner)."""
    described = {"probe": probe, "warning": warning}
    if status is None:
        view = dict(NO_GPU_STATUS)
        if warning is not None:
            view["error"] = warning
        return {**view, **described}
    snapshot = status.snapshot
    return {
        **described,
        "source": status.source,
        "up": status.up,
        "error": status.error,
        "reason": status.reason,
        "consecutive_failures": status.consecutive_failures,
        "last_success_wall": None if snapshot is None else snapshot.taken_at_wall,
        "age_s": status.age_s,
        "stale": status.stale,
        "driver_version": None if snapshot is None else snapshot.driver_version,
        "gpus": [] if snapshot is None else [gpu_view(g) for g in snapshot.gpus],
    }


def gpu_view(stats: GpuStats) -> Json:
    return {
        "index": stats.index,
        "uuid": stats.uuid,
        "name": stats.name,
        "total_mib": stats.total_mib,
        "used_mib": stats.used_mib,
        "free_mib": stats.free_mib,
        "reserved_mib": _mib_up(stats.reserved_bytes),
        "utilization_gpu_pct": stats.utilization_gpu_pct,
        "utilization_memory_pct": stats.utilization_memory_pct,
        "temperature_c": stats.temperature_c,
        "power_w": stats.power_w,
        "lost": stats.lost,
        "error": stats.error,
        "processes": [{"pid": p.pid, "used_mib": _mib_up(p.used_bytes)} for p in stats.processes],
    }


def _mib_up(value: int | None) -> int | None:
    return None if value is None else -(-value // MIB)


def expires_in_s(expires_at: float | None) -> float | None:
    return None if expires_at is None else round(expires_at - time.time(), 1)


def footprint_view(footprint: Footprint) -> Json:
    """A planned footprint for `/status`: MiB rounded to whole numbers."""
    data: Json = {"mib": footprint.mib, "source": footprint.source}
    parts = footprint.parts
    if parts is not None:
        data.update(
            weights_mib=round(parts.weights_bytes / MIB),
            kv_cache_mib=round(parts.kv_cache_bytes / MIB),
            kv_budget_mib=round(parts.kv_budget_bytes / MIB),
            cuda_graphs_mib=round(parts.cuda_graphs_bytes / MIB),
            overhead_mib=round(parts.overhead_bytes / MIB),
            cuda_context_mib=round(parts.cuda_context_bytes / MIB),
            gpu_memory_utilization=parts.gpu_memory_utilization,
            kv_cache_memory_bytes=parts.kv_cache_memory_bytes,
            fits_gpu=parts.fits_gpu,
            problems=list(parts.problems),
            max_concurrency=(
                None if parts.max_concurrency is None else round(parts.max_concurrency, 2)
            ),
        )
    return data


def circuit_view(snap: CircuitSnapshot, wall_minus_clock: float) -> Json:
    return {
        "state": snap.state.value,
        "failures": snap.consecutive_failures,
        "open_until": None
        if snap.open_until is None
        else round(snap.open_until + wall_minus_clock, 3),
        "retry_in_s": round(snap.retry_in_s, 3),
        "last_reason": snap.last_reason,
        "trial_in_flight": snap.trial_in_flight,
    }


def fallback_view(status: CloudStatus) -> Json:
    """Providers, circuits and chains in `/status` (no key, only whether it is set)."""
    return {
        "providers": {
            name: {
                "kind": p.kind,
                "base_url": p.base_url,
                "model": p.model,
                "api_key_env": p.api_key_env,
                "key_present": p.key_present,
                "active": p.active,
            }
            for name, p in status.providers.items()
        },
        "circuits": {
            entry: circuit_view(snap, status.wall_minus_clock)
            for entry, snap in status.circuits.items()
        },
        "chains": {
            key: {
                "entries": list(chain.entries),
                "models": list(chain.models),
                "on_context_length": chain.config.on_context_length,
                "wake_timeout_s": chain.config.wake_timeout_s,
                "deadline_s": chain.config.deadline_s,
                "max_attempts": chain.config.max_attempts,
            }
            for key, chain in status.chains.items()
        },
    }


def host_view(host: Host, status: GpuStatus | None) -> Json:
    """One machine in `/status` `hosts`: its probe and GPUs, what holds them, its backends."""
    return {
        "name": host.name,
        "probe": host.arbiter.probe_name,
        # Where its `gpus: auto` (or counted) backends go at each start: pack or spread.
        "placement": host.arbiter.policy,
        "gpu": gpu_status_view(status, probe=host.arbiter.probe_name, warning=host.probe_warning),
        "holds": {
            "yield": yield_view(host.vram_yield.current),
            "zones": [zone_view(z) for z in host.arbiter.book.zones.values() if z.kind == "zone"],
            "placed_mib": host.arbiter.placed_mib(),
        },
        "backends": list(host.backends),
        "host_ram": host_ram_view(host.ram.view()),
    }


def host_ram_view(view: HostRamView) -> Json:
    """A host's RAM in `/status` (MiB): what the probe read, the budget of level-1
    sleepers and what they are charged, each sleeper with its charge (for a bar:
    `charged_mib` of `budget_mib`, within `total_mib`, `available_mib` free now).

    The bar's parts come from the same reading and add up to `total_mib`: each sleeper's
    `in_use_mib` (its charge, within what is used), `other_mib` (used, less those) and
    `available_mib`. A charge is the budget's estimate of the weights a level-1 sleep
    keeps; it can exceed what the probe sees used (a sleep under way, a fake server), and
    is then cut, never drawn beyond the machine's RAM."""
    used, in_use, other = ram_parts(
        view.total_mib, view.available_mib, [s.charged_mib for s in view.sleepers]
    )
    return {
        "probe": view.probe,
        "up": view.up,
        "error": view.error,
        "age_s": view.age_s,
        "total_mib": view.total_mib,
        "available_mib": view.available_mib,
        "used_mib": used,
        "other_mib": other,
        "budget_mib": view.budget_mib,
        "budget_from": view.budget_from,
        "reserve_mib": view.reserve_mib,
        "charged_mib": view.charged_mib,
        "free_budget_mib": (
            None if view.budget_mib is None else max(0, view.budget_mib - view.charged_mib)
        ),
        "sleepers": [
            {
                "backend": s.backend,
                "charged_mib": s.charged_mib,
                "in_use_mib": part,
                "charged_from": s.charged_from,
                "pending": s.pending,
            }
            for s, part in zip(view.sleepers, in_use, strict=True)
        ],
    }


def ram_parts(
    total_mib: int | None, available_mib: int | None, charges: list[int]
) -> tuple[int | None, list[int | None], int | None]:
    """(used, each charge within used, other use): one reading's parts, which with
    `available_mib` add up to `total_mib` (all None without a reading)."""
    if total_mib is None or available_mib is None:
        return None, [None] * len(charges), None
    used = max(0, total_mib - min(available_mib, total_mib))
    room = used
    in_use: list[int | None] = []
    for charge in charges:
        part = max(0, min(charge, room))
        room -= part
        in_use.append(part)
    return used, in_use, room


def status_view(services: Services) -> Json:
    """`GET /status`, and the snapshot `/status/stream` starts with. Reads state only:
    never NVML or a backend. `gpu` and `holds` are the local host's; `hosts` has every
    host (the local one first)."""
    profile = services.profiles.profile
    gpu_status = {
        name: None if host.monitor is None else host.monitor.status()
        for name, host in services.hosts.items()
    }
    hosts = [host_view(host, gpu_status[name]) for name, host in services.hosts.items()]
    totals = {(h["name"], g["index"]): g["total_mib"] for h in hosts for g in h["gpu"]["gpus"]}
    backends = []
    for name, backend in services.backends.items():
        planned = None
        if profile is not None:
            key = (backend.config.host_name, backend.memory.gpus[0])
            planned = profile.planned_mib(name, totals.get(key))
        view = BackendView.of(backend)
        backends.append({**backend_view(view), "vram": backend_vram_view(view, planned)})
    local = hosts[0]
    plane = services.plane  # the fallback and the keys of one plane
    return {
        "gateway": {
            "started_at": services.started_at,
            "uptime_s": round(time.time() - services.started_at, 1),
        },
        "gpu": local["gpu"],
        "host_ram": local["host_ram"],
        "backends": backends,
        "holds": local["holds"],
        "hosts": hosts,
        "profile": {"active": services.profiles.active},
        # Weekly windows (models.yaml `schedules:`): active, next edge, undone by a person.
        "schedules": services.scheduler.status(),
        # Whether the state file holds what the gateway holds (an ended hold waits for
        # its save to be retried while it does not).
        "state": services.store.status(),
        "fallback": fallback_view(plane.cloud.status()),
        # Client keys: scope, limits and use in this process (names only, never secrets).
        "keys": [key.view() for key in plane.keys.keys],
        "events": services.events.recent(),
        # The configuration running: its files' hash, when and how it was (re)loaded.
        "config": services.config_record.view(),
        "notifications": services.notifier.view(),
    }
