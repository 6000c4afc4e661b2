"""Opening a request on a local backend: the one path a plain request and a fallback
chain's local entry both take (lease first, then the upstream; errors counted once)."""

from __future__ import annotations

from prometheus_client import Counter

from app.errors import UpstreamError
from app.lifecycle.backend import Backend
from app.lifecycle.lease import Lease
from app.routing.exchange import Call
from app.upstreams.http import UpstreamResponse


async def open_local(
    backend: Backend,
    lease: Lease,
    call: Call,
    upstream_errors: Counter,
    *,
    body: bytes | None = None,
    first_byte_s: float | None = None,
) -> UpstreamResponse:
    """Open `call` (its path, method, headers, and its body unless `body` replaces it) on
    the backend whose `lease` the caller holds.

    Transport failures and 5xx answers count in `microscheduler_upstream_errors_total`;
    on any failure the lease is released before the error propagates, so a held slot is
    never leaked. `first_byte_s` overrides the backend's first-byte timeout (a chain gives
    an attempt what is left of its deadline)."""
    try:
        response = await backend.upstream.open(
            call.path,
            call.body if body is None else body,
            call.headers,
            first_byte_s=first_byte_s,
            method=call.method,
        )
    except UpstreamError as exc:
        lease.release()
        upstream_errors.labels(backend.name, exc.kind).inc()
        raise
    except BaseException:
        lease.release()
        raise
    if response.status >= 500:
        upstream_errors.labels(backend.name, "http_5xx").inc()
    return response
