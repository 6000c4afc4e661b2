"""The request path's increments (`app.metrics.add`, `observe`) skip the client
library's per-call checks: what they expose must be exactly what the library's own
`inc`, `dec` and `observe` expose for the same calls."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from app.metrics import LATENCY_BUCKETS, add, observe

# Below the first bound, on bounds exactly (a bucket's bound holds its value), between
# them, over the last finite one (+Inf), zero.
VALUES = (0.0, 0.001, 0.005, 0.0050001, 0.3, 1.0, 2.4999, 600.0, 601.0, 10_000.0)


def exposition(fill: Callable[[CollectorRegistry], None]) -> list[str]:
    registry = CollectorRegistry()
    fill(registry)
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_a_histogram_child_observed_fast_exposes_what_observe_does() -> None:
    def fill(registry: CollectorRegistry, *, fast: bool) -> None:
        series = Histogram("t", "t", ["backend"], buckets=LATENCY_BUCKETS, registry=registry)
        child = series.labels("b")
        for value in VALUES:
            if fast:
                observe(child, value)
            else:
                child.observe(value)

    library = exposition(lambda r: fill(r, fast=False))
    ours = exposition(lambda r: fill(r, fast=True))
    assert ours == library
    assert 't_bucket{backend="b",le="0.005"} 3.0' in library  # 0, 0.001 and 0.005 itself
    assert 't_bucket{backend="b",le="+Inf"} 10.0' in library


def test_counter_and_gauge_children_added_fast_expose_what_inc_and_dec_do() -> None:
    def library(registry: CollectorRegistry) -> None:
        counter = Counter("c", "c", ["k"], registry=registry).labels("x")
        gauge = Gauge("g", "g", ["k"], registry=registry).labels("x")
        plain = Counter("p", "p", registry=registry)
        counter.inc()
        counter.inc(41)
        gauge.inc()
        gauge.inc()
        gauge.dec()
        plain.inc(2.5)

    def fast(registry: CollectorRegistry) -> None:
        counter = Counter("c", "c", ["k"], registry=registry).labels("x")
        gauge = Gauge("g", "g", ["k"], registry=registry).labels("x")
        plain = Counter("p", "p", registry=registry)
        add(counter)
        add(counter, 41)
        add(gauge)
        add(gauge)
        add(gauge, -1)
        add(plain, 2.5)

    assert exposition(fast) == exposition(library)
    assert 'c_total{k="x"} 42.0' in exposition(fast)
    assert 'g{k="x"} 1.0' in exposition(fast)
