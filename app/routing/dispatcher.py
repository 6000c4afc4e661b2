"""Dispatch: from a routed request to an opened upstream response holding a lease.

The dispatcher decides where a request goes: a model with a fallback chain is walked by
`app.routing.chains.ChainCall`; any other goes to its backend. Both open a local backend
through `app.routing.local.open_upstream` and return the same `Exchange`.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.errors import ModelNotFound, UpstreamError
from app.lifecycle.backend import Backend
from app.metrics import Metrics
from app.routing.chains import ChainCall
from app.routing.cloud import Chain, Cloud
from app.routing.exchange import Call, Exchange, Notice
from app.routing.fallback_metrics import TokenCounter
from app.routing.local import open_upstream
from app.routing.registry import Registry, Route


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
        self._cloud = cloud
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

    async def open(self, call: Call, notice: Notice | None = None) -> Exchange:
        """Open `call` where it goes: its fallback chain when the name the client used has
        one, else its backend (woken if needed; `notice` is called every few seconds
        while the request is held for a start)."""
        chain = self._chains.get(call.route.name)
        if chain is not None and self._cloud is not None:
            return await ChainCall(self._cloud, chain, call).open(notice)
        backend = self._backends[call.route.backend]
        lease = await backend.acquire(notice)
        response = await open_upstream(
            backend, lease, call.path, call.body, call.headers, self._metrics.upstream_errors
        )
        return Exchange(
            call.route, backend.name, response, lease, tokens=self._tokens.get(backend.name)
        )

    def record_stream_error(self, exchange: Exchange, exc: UpstreamError) -> None:
        if exchange.backend in self._backends:
            self._metrics.upstream_errors.labels(exchange.backend, exc.kind).inc()
        if exchange.hooks is not None:
            exchange.hooks.stream_failed(exchange, exc)
