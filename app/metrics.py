"""Prometheus metrics of the gateway, one registry per app (and per test).

Labels come from configuration only (backend names, configured model names, a fixed set
of endpoints and error kinds), never from request data, so cardinality stays bounded.
Children are cached: the hot path does a dict lookup, not `labels()`.

The GPU series are `app.gpu.collector`'s; the host RAM series (`microscheduler_host_ram_*`,
label `host`: the budget of level-1 sleepers) are `app.vram.host_ram`'s; the load
scraped from each vLLM is `app.upstreams.vllm_load`'s; the backends' lifecycle (states,
starts, stops, sleeps, swaps, yields, the state file, profiles) is `app.lifecycle.metrics`'s,
which adds its series to these. `Declare` makes a series in a registry under the
`microscheduler_` prefix, for every module that declares some (`series_name` for a
collector's series). This module is on the ground floor: it imports nothing of the app.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

# Up to minutes: LLM generations and (later) cold starts are long.
LATENCY_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
UPSTREAM_ERROR_KINDS: Final = (
    "connect",
    "connect_timeout",
    "first_byte_timeout",
    "pool_timeout",
    "idle_timeout",
    "disconnected",
    "http_5xx",
)
WAIT_REASONS: Final = ("wake", "max_inflight", "connection_pool")
TOKEN_TYPES: Final = ("prompt", "completion")  # the `type` of the token counters
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST


# The request path's increments, without the client library's checks on every call: its
# `inc` asks whether the series is a parent (never: these are children, or series without
# labels) and whether the amount is negative (a counter's never is, where these are
# called), and a histogram's `observe` walks its bounds one by one. About a dozen such
# calls a request. `tests/unit/test_metrics_fast.py` holds them to the library's own.
def add(series: Counter | Gauge, amount: float = 1) -> None:
    """`series.inc(amount)` (a gauge's `dec` is a negative `amount`)."""
    series._value.inc(amount)


def observe(series: Histogram, value: float) -> None:
    """`series.observe(value)`: the sum, and the first bucket whose bound holds it."""
    series._sum.inc(value)
    series._buckets[bisect_left(series._upper_bounds, value)].inc(1)


NAMESPACE: Final = "microscheduler"  # the prefix of every series name


def series_name(name: str) -> str:
    """`microscheduler_<name>`: a series a collector makes at scrape time (a
    `GaugeMetricFamily`), which `Declare` does not declare."""
    return f"{NAMESPACE}_{name}"


class Declare:
    """Declares series in one registry, each name prefixed `microscheduler_` (`NAMESPACE`, the
    one place it is written), and histograms up to minutes unless told otherwise."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, documentation, labels, namespace=NAMESPACE, registry=self._registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, documentation, labels, namespace=NAMESPACE, registry=self._registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        return Histogram(
            name,
            documentation,
            labels,
            namespace=NAMESPACE,
            buckets=buckets,
            registry=self._registry,
        )


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        new = Declare(self.registry)
        self.requests = new.counter(
            "requests",
            "Requests answered on the OpenAI API, by HTTP status (499: client went away).",
            ("model", "backend", "endpoint", "status"),
        )
        self.duration = new.histogram(
            "request_duration_seconds",
            "Time from request to the last byte of the response.",
            ("backend", "endpoint"),
        )
        self.ttfb = new.histogram(
            "time_to_first_byte_seconds",
            "Time from request to the first byte of the response body.",
            ("backend", "endpoint"),
        )
        self.upstream_errors = new.counter(
            "upstream_errors", "Failures talking to an upstream, by kind.", ("backend", "kind")
        )
        self.in_flight = new.gauge(
            "requests_in_flight",
            "Requests holding a lease on a backend (relaying or waiting for it).",
            ("backend",),
        )
        self.backend_up = new.gauge(
            "backend_up",
            "1 when the backend's last health check answered 200, else 0.",
            ("backend",),
        )
        self.waiting = new.gauge(
            "requests_waiting",
            "Requests held, by reason: wake (until their backend is ready), max_inflight "
            "(for a slot on their ready backend, max_inflight in flight), connection_pool "
            "(for a free connection, max_connections in use).",
            ("backend", "reason"),
        )
        self.pool_wait = new.histogram(
            "upstream_pool_wait_seconds",
            "How long requests waited for a free connection to their backend "
            "(only with max_connections set, and only those that waited).",
            ("backend",),
        )
        self.output_dropped = new.counter(
            "backend_output_dropped_lines",
            "Lines of a process backend's output its relay dropped: the server wrote faster "
            "than its budget (each drop is also noted in the output file itself).",
            ("backend",),
        )
        self.output_skipped = new.counter(
            "backend_output_skipped_bytes",
            "Bytes of a process backend's output file the gateway did not read: it was too "
            "far behind, or emptied a file no relay capped.",
            ("backend",),
        )
        self._request_children: dict[tuple[str, str, str, str], Counter] = {}
        self._timing_children: dict[tuple[str, str], tuple[Histogram, Histogram]] = {}

    def declare_backend(self, backend: str) -> None:
        """Create the backend's request-side series at zero, so dashboards see them before
        traffic (its lifecycle series: `LifecycleMetrics.declare_backend`)."""
        self.in_flight.labels(backend)
        self.backend_up.labels(backend)
        for kind in UPSTREAM_ERROR_KINDS:
            self.upstream_errors.labels(backend, kind)
        for why in WAIT_REASONS:
            self.waiting.labels(backend, why)
        self.pool_wait.labels(backend)

    def observe_request(
        self,
        *,
        model: str,
        backend: str,
        endpoint: str,
        status: int,
        duration_s: float,
        ttfb_s: float | None,
    ) -> None:
        key = (model, backend, endpoint, str(status))
        counter = self._request_children.get(key)
        if counter is None:
            counter = self._request_children[key] = self.requests.labels(*key)
        add(counter)
        timing = self._timing_children.get((backend, endpoint))
        if timing is None:
            timing = self._timing_children[(backend, endpoint)] = (
                self.duration.labels(backend, endpoint),
                self.ttfb.labels(backend, endpoint),
            )
        observe(timing[0], duration_s)
        if ttfb_s is not None:
            observe(timing[1], ttfb_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class PoolMetrics:
    """`HttpUpstream`'s pool observer for one backend: the waiting gauge and the histogram."""

    def __init__(self, metrics: Metrics, backend: str) -> None:
        self._gauge = metrics.waiting.labels(backend, "connection_pool")
        self._histogram = metrics.pool_wait.labels(backend)

    def waiting(self, delta: int) -> None:
        self._gauge.inc(delta)

    def waited(self, seconds: float) -> None:
        self._histogram.observe(seconds)


class OutputMetrics:
    """A process backend's lost output (`ProcessRuntime`'s `OutputCounts`); its series
    exist from 0 once this is made."""

    def __init__(self, metrics: Metrics, backend: str) -> None:
        self._dropped = metrics.output_dropped.labels(backend)
        self._skipped = metrics.output_skipped.labels(backend)

    def dropped_lines(self, n: int) -> None:
        self._dropped.inc(n)

    def skipped_bytes(self, n: int) -> None:
        self._skipped.inc(n)
