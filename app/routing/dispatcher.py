"""Dispatch: from a resolved route to an opened upstream response holding a lease.

This is where the fallback chain will walk its entries; today a route has one target.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.errors import ModelNotFound, UpstreamError
from app.lifecycle.backend import Backend, Lease, WaitNotice
from app.metrics import Metrics
from app.routing.registry import Registry, Route
from app.upstreams.http import UpstreamResponse


class Exchange:
    """An upstream response in progress and the lease that goes with it."""

    __slots__ = ("_lease", "backend", "response", "route")

    def __init__(self, route: Route, backend: str, response: UpstreamResponse, lease: Lease):
        self.route = route
        self.backend = backend
        self.response = response
        self._lease = lease

    def finish(self) -> None:
        """Give back the connection (pooled if the body was read to its end) and the lease."""
        try:
            self.response.release()
        finally:
            self._lease.release()


class Dispatcher:
    def __init__(self, registry: Registry, backends: Mapping[str, Backend], metrics: Metrics):
        self._registry = registry
        self._backends = backends
        self._metrics = metrics

    def route(self, model: str) -> Route:
        route = self._registry.resolve(model)
        if route is None:
            raise ModelNotFound(model)
        return route

    async def open(
        self,
        route: Route,
        path: str,
        body: bytes,
        headers: dict[str, str],
        on_wait: WaitNotice | None = None,
    ) -> Exchange:
        """Wait for the backend (waking it if needed), then open the upstream request.

        `on_wait` is called every few seconds while the request is held for a start.
        """
        backend = self._backends[route.backend]
        lease = await backend.acquire(on_wait)
        try:
            response = await backend.upstream.open(path, body, headers)
        except UpstreamError as exc:
            lease.release()
            self._metrics.upstream_errors.labels(backend.name, exc.kind).inc()
            raise
        except BaseException:
            lease.release()
            raise
        if response.status >= 500:
            self._metrics.upstream_errors.labels(backend.name, "http_5xx").inc()
        return Exchange(route, backend.name, response, lease)

    def record_stream_error(self, exchange: Exchange, exc: UpstreamError) -> None:
        self._metrics.upstream_errors.labels(exchange.backend, exc.kind).inc()
