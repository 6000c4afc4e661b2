"""The load of a local vLLM, read from its Prometheus `/metrics`.

vLLM (V1 engine) exposes, with labels `model_name` and `engine`:
`vllm:num_requests_running`, `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc`
(a fraction 0-1 despite its name; `vllm:gpu_cache_usage_perc` in images older than 0.9,
read when the new name is absent).

It also reads `vllm:engine_sleep_state` (`sleep_level`): the level a sleeping server
sleeps at, which its wake needs (see `SLEEP_STATE`).

Several label sets (data-parallel engines, or several served names) are combined:
request counts are summed (they are requests of the one backend), while the KV-cache
usage is the maximum over engines: each engine has its own KV pool, and the fullest one
is the one that queues and preempts; a sum would exceed 1 and a mean would hide a full
engine behind an idle one.

`parse_vllm_load` is pure; `app.upstreams.vllm.VllmClient.load()` does the GET and raises
only `ScrapeError`.

`VllmLoadMetrics` exports what the last scrape of each backend said. When a scrape fails
or the backend is not running, `microscheduler_backend_metrics_up` is 0 and the three load
series of that backend are removed (not NaN, not the old value): a stopped backend shows
"no data", never an old KV usage, and `sum()` over backends stays a number.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from app.metrics import Declare

KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
KV_CACHE_USAGE_OLD: Final = "vllm:gpu_cache_usage_perc"  # before vLLM 0.9, removed since
REQUESTS_RUNNING: Final = "vllm:num_requests_running"
REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
# vllm/v1/metrics/loggers.py (0.33, PrometheusStatLogger): a gauge with labels
# `model_name`, `engine` and `sleep_state`, one series per state: `awake`,
# `weights_offloaded`, `discard_all`. `record_sleep_state(sleep, level)` sets awake=0 while
# asleep, weights_offloaded=1 at level 1, discard_all=1 at level 2 (so level 0, a paused
# scheduler, is awake=0 with both others 0); vllm/v1/engine/async_llm.py records it in
# `sleep()` (level N), `release_kv_cache_memory()` (as level 0), and back to awake only
# when `wake_up()` leaves everything resident (a partial wake keeps the level). Absent
# with `--disable-log-stats` (vllm/v1/engine/async_llm.py makes no stat loggers then).
SLEEP_STATE: Final = "vllm:engine_sleep_state"
_WANTED: Final = (
    KV_CACHE_USAGE,
    KV_CACHE_USAGE_OLD,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    SLEEP_STATE,
)
_NAME_START: Final = re.compile(r"[a-zA-Z_:]")


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """None: the backend's `/metrics` does not have that metric.

    `sleep_level`: 0, 1 or 2 when `vllm:engine_sleep_state` says the engine sleeps at that
    level (the deepest over engines); None when it says awake or is absent."""

    kv_cache_usage_ratio: float | None = None
    requests_running: int | None = None
    requests_waiting: int | None = None
    sleep_level: int | None = None


class MetricsParseError(ValueError):
    """The text is not Prometheus text exposition."""


class ScrapeError(Exception):
    """Scraping `/metrics` failed. `kind`: `connect`, `timeout`, `request`, `status` or
    `parse`; the message says what failed."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_vllm_load(text: str) -> BackendLoad:
    """The load in a `/metrics` body; `MetricsParseError` when it is not an exposition.

    Only the lines of the wanted metrics go through the Prometheus parser: a vLLM
    exposition has hundreds of histogram lines, and parsing all of them would hold the
    event loop for tens of milliseconds. The other lines are only checked to look like
    exposition lines (a comment or a metric name), which catches an HTML or JSON body."""
    relevant: list[str] = []
    for line in text.splitlines():
        stripped = line.lstrip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            words = stripped.split(maxsplit=3)  # "# HELP name text", "# TYPE name gauge"
            if len(words) > 2 and words[2] in _WANTED:
                relevant.append(stripped)
        elif stripped.startswith(_WANTED):
            relevant.append(stripped)
        elif not _NAME_START.match(stripped):
            raise _parse_error(text, f"invalid line {stripped[:60]!r}")
    values: dict[str, list[float]] = {name: [] for name in _WANTED}
    # Per engine (its labels but `sleep_state`): each state's value.
    sleep: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families("\n".join(relevant) + "\n"):
            for sample in family.samples:
                if math.isnan(sample.value):
                    continue
                if sample.name == SLEEP_STATE:
                    labels = dict(sample.labels)
                    state = labels.pop("sleep_state", "")
                    sleep.setdefault(tuple(sorted(labels.items())), {})[state] = sample.value
                    continue
                found = values.get(sample.name)
                if found is not None:
                    found.append(float(sample.value))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise _parse_error(text, str(exc)) from exc
    kv = values[KV_CACHE_USAGE] or values[KV_CACHE_USAGE_OLD]
    return BackendLoad(
        kv_cache_usage_ratio=max(kv) if kv else None,
        requests_running=_count(values[REQUESTS_RUNNING]),
        requests_waiting=_count(values[REQUESTS_WAITING]),
        sleep_level=_sleep_level(sleep.values()),
    )


def _sleep_level(engines: Iterable[dict[str, float]]) -> int | None:
    """The deepest level any engine sleeps at (its wake must undo that one); None when
    every engine reports awake, or none reports."""
    levels = [_engine_level(states) for states in engines]
    asleep = [level for level in levels if level is not None]
    return max(asleep) if asleep else None


def _engine_level(states: dict[str, float]) -> int | None:
    if states.get("discard_all") == 1:
        return 2
    if states.get("weights_offloaded") == 1:
        return 1
    if states.get("awake") == 0:
        return 0
    return None


def _parse_error(text: str, problem: str) -> MetricsParseError:
    first = text.lstrip()[:60]
    return MetricsParseError(
        f"not Prometheus text exposition ({problem}); the body starts with {first!r}"
    )


def _count(values: list[float]) -> int | None:
    return round(sum(values)) if values else None


class VllmLoadMetrics:
    """Per-backend load as scraped from vLLM's `/metrics`; backends from config only."""

    def __init__(self, registry: CollectorRegistry) -> None:
        new = Declare(registry)
        self.kv_cache_usage = new.gauge(
            "backend_kv_cache_usage_ratio",
            "KV-cache usage of the backend's fullest engine (0-1), from vLLM's /metrics.",
            ("backend",),
        )
        self.requests_running = new.gauge(
            "backend_requests_running",
            "Requests in the backend's running batches, from vLLM's /metrics.",
            ("backend",),
        )
        self.requests_waiting = new.gauge(
            "backend_requests_waiting",
            "Requests queued in the backend, from vLLM's /metrics.",
            ("backend",),
        )
        self.metrics_up = new.gauge(
            "backend_metrics_up",
            "1 when the last scrape of the backend's /metrics worked, else 0.",
            ("backend",),
        )
        self._latest: dict[str, BackendLoad] = {}

    def load_of(self, backend: str) -> BackendLoad | None:
        """What the last scrape of `backend` said; None when it failed or is not running
        (replica groups read it to break ties: `app.routing.replicas`)."""
        return self._latest.get(backend)

    def declare(self, backend: str) -> None:
        """Create the backend's `metrics_up` series (0 until a scrape works)."""
        self.metrics_up.labels(backend).set(0)

    def update(self, backend: str, load: BackendLoad | None) -> None:
        """Record a scrape: None when it failed or the backend is not running."""
        self.metrics_up.labels(backend).set(0 if load is None else 1)
        if load is None:
            self._latest.pop(backend, None)
        else:
            self._latest[backend] = load
        values = (
            (self.kv_cache_usage, None if load is None else load.kv_cache_usage_ratio),
            (self.requests_running, None if load is None else load.requests_running),
            (self.requests_waiting, None if load is None else load.requests_waiting),
        )
        for gauge, value in values:
            if value is None:
                gauge.remove(backend)  # a no-op when the series does not exist
            else:
                gauge.labels(backend).set(value)
