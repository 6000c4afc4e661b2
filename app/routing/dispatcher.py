"""Dispatch: from a resolved route to an opened upstream response holding a lease.

A model without a fallback chain goes to its backend (`open`); one with a chain is walked
by `app.routing.chains.ChainCall`, which returns the same `Exchange`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from app.errors import ModelNotFound, UpstreamError
from app.lifecycle.backend import Backend
from app.lifecycle.lease import Lease, WaitNotice
from app.metrics import Metrics
from app.routing.fallback_metrics import TokenCounter
from app.routing.registry import Registry, Route
from app.upstreams.http import Relayable

if TYPE_CHECKING:
    from app.routing.chains import Chain, Cloud


class ExchangeHooks(Protocol):
    """What a fallback chain learns after the first byte (circuits, provider outcomes)."""

    def stream_failed(self, exchange: Exchange, error: UpstreamError) -> None: ...

    def finished(self, exchange: Exchange) -> None: ...


class Exchange:
    """An upstream response in progress and the lease that goes with it.

    `backend` is the entry that answers (a backend, or a provider for a chain); `headers`
    are added to the response (a chain's `x-microscheduler-*`)."""

    __slots__ = (
        "_lease",
        "backend",
        "completed",
        "headers",
        "hooks",
        "response",
        "route",
        "tokens",
    )

    def __init__(
        self,
        route: Route,
        backend: str,
        response: Relayable,
        lease: Lease | None,
        *,
        headers: list[tuple[bytes, bytes]] | None = None,
        tokens: TokenCounter | None = None,
        hooks: ExchangeHooks | None = None,
    ) -> None:
        self.route = route
        self.backend = backend
        self.response = response
        self._lease = lease
        self.headers = headers
        self.tokens = tokens
        self.hooks = hooks
        self.completed = False

    def body_done(self, tail: bytes) -> None:
        """The body was relayed to its end; `tail` is its last bytes (usage is read there)."""
        self.completed = True
        if self.tokens is not None:
            self.tokens.count_tail(tail)

    def finish(self) -> None:
        """Give back the connection (pooled if the body was read to its end) and the lease."""
        try:
            self.response.release()
        finally:
            if self._lease is not None:
                self._lease.release()
            if self.hooks is not None:
                self.hooks.finished(self)


class Dispatcher:
    def __init__(
        self,
        registry: Registry,
        backends: Mapping[str, Backend],
        metrics: Metrics,
        cloud: Cloud | None = None,
    ) -> None:
        self._registry = registry
        self._backends = backends
        self._metrics = metrics
        self.cloud = cloud
        self._chains: Mapping[str, Chain] = cloud.chain_by_model if cloud is not None else {}
        self._tokens: Mapping[str, TokenCounter] = (
            {name: cloud.metrics.token_counter(name) for name in backends}
            if cloud is not None
            else {}
        )

    def route(self, model: str) -> Route:
        route = self._registry.resolve(model)
        if route is None:
            raise ModelNotFound(model)
        return route

    def chain_for(self, route: Route) -> Chain | None:
        """The fallback chain of the name the client used, if one is configured."""
        return self._chains.get(route.name)

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
        return Exchange(route, backend.name, response, lease, tokens=self._tokens.get(backend.name))

    def record_stream_error(self, exchange: Exchange, exc: UpstreamError) -> None:
        if exchange.backend in self._backends:
            self._metrics.upstream_errors.labels(exchange.backend, exc.kind).inc()
        if exchange.hooks is not None:
            exchange.hooks.stream_failed(exchange, exc)
