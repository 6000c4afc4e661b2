"""Dispatch: from a routed request to an opened upstream response holding a lease.

The dispatcher decides where a request goes: a model with a fallback chain is walked by
`app.routing.chains.ChainCall`; any other goes to its backend. Both open a local backend
through `app.routing.local` (`served_target`, `open_entry`, `LocalAnswer.relayable`), try
a replica group's members through `app.routing.replicas.MemberAttempts`, and return the
same `Exchange`.

A backend takes only the APIs it serves (`Backend.serving`: `endpoints:`, else what its
server's /openapi.json listed, else its task's or runner's set): a call it cannot take as
is nor translated is refused 404 `endpoint_not_served` before anything is woken, and again
after a wake when the server said then that it does not serve it. A follow-up of a stored
response on a route its server does not have (vLLM has no `DELETE /v1/responses/{id}`
and no `input_items`) is refused the same way, once its routes are known.
A name served by a replica group goes to the member `app.routing.replicas` picks; one
that fails before the first byte (refused, unreachable, 5xx) is retried once on another
member, and the second answer or error is the request's. A model with a fallback chain
walks its chain instead, whose entry may be the group (`ChainCall` picks the same way).

A `/v1/responses` answer's id is remembered with the entry that created it (a replica
group's member, a chain's entry), so the follow-ups on that id reach the same entry
(`open_stored`): `GET`, `cancel`, and a create that continues it (`previous_response_id`,
`pinned_entry`). vLLM keeps responses only with `VLLM_ENABLE_RESPONSES_API_STORE=1`: its
404 for an id is explained so (`app.routing.responses.not_stored`).

A local vLLM's 400 refusing `tools` because it runs without `--enable-auto-tool-choice
--tool-call-parser` (Claude Code fails so on every request) is relayed with a hint naming
the flags appended to vLLM's message (`app.routing.tool_hint`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Final

from app.errors import (
    EndpointNotServed,
    GatewayError,
    MethodNotAllowed,
    ModelNotFound,
    ResponseNotFound,
    UpstreamError,
    WakeTimeout,
)
from app.lifecycle.lease import Lease, WaitNotice
from app.metrics import Metrics
from app.routing.chains import ChainCall
from app.routing.cloud import Chain, Cloud
from app.routing.exchange import Call, Exchange, Notice
from app.routing.local import open_entry, served_target
from app.routing.rebuilds import Rebuilds
from app.routing.registry import Registry, Route
from app.routing.replicas import MemberAttempts, Replicas
from app.routing.responses import ResponseIds, StoredAt, created_response_id, not_stored
from app.routing.routed import RoutedBackend, removed
from app.routing.tool_hint import hint, hinted, is_json
from app.settings.endpoints import Api
from app.upstreams.http import BufferedResponse
from app.upstreams.usage import TokenCounter
from app.upstreams.vllm_load import BackendLoad

logger = logging.getLogger(__name__)

DEFAULT_PATIENCE_S: Final = 60.0  # a rebuild's hold for a name with no backend of its own


class Dispatcher:
    def __init__(
        self,
        registry: Registry,
        backends: Mapping[str, RoutedBackend],
        metrics: Metrics,
        cloud: Cloud | None = None,
        response_ids: ResponseIds | None = None,
        load_of: Callable[[str], BackendLoad | None] | None = None,
        replicas: Replicas | None = None,
        rebuilds: Rebuilds | None = None,
    ) -> None:
        """`load_of`: a backend's last scraped vLLM load (replica groups break ties on it).
        `replicas`: the running one's, kept by a reload (its metric is registered once).
        `rebuilds`: the backends a reload is rebuilding (a request for one waits)."""
        self._registry = registry
        self._rebuilds = rebuilds if rebuilds is not None else Rebuilds()
        self._backends = backends
        self._metrics = metrics
        self._cloud = cloud
        self._chains: Mapping[str, Chain] = cloud.chain_by_model if cloud is not None else {}
        self._tokens: Mapping[str, TokenCounter] = (
            {name: cloud.metrics.token_counter(name) for name in backends}
            if cloud is not None
            else {}
        )
        self.response_ids = response_ids if response_ids is not None else ResponseIds()
        self.replicas = replicas or Replicas(
            backends, metrics.registry, load_of or (lambda _name: None)
        )
        # Backends whose tool refusal was logged (a reload's dispatcher logs afresh).
        self._tool_hinted: set[str] = set()

    def route(self, model: str) -> Route:
        route = self._registry.resolve(model)
        if route is None:
            raise ModelNotFound(model)
        return route

    async def open(self, call: Call, notice: Notice | None = None) -> Exchange:
        """Open `call` where it goes: its fallback chain when the name the client used has
        one, else its backend (woken if needed; `notice` is called every few seconds
        while the request is held for a start). A backend it may use that a reload is
        rebuilding is waited for first (`app.routing.rebuilds`), as a wake would be."""
        chain = self._chains.get(call.route.name)
        if self._rebuilds.active:
            await self._settled(call, chain)
        if chain is not None and self._cloud is not None:
            exchange = await ChainCall(self._cloud, chain, call, self.replicas).open(notice)
        elif call.route.group is not None:
            exchange = await self._open_group(call.route.group, call, notice)
        else:
            exchange = await self._open_backend(call.route.backend, call, notice)
        self._explain_not_stored(call, exchange, None)
        if exchange.response.status == 400:
            self._hint_tool_parser(exchange)
        self._remember(call, exchange)
        return exchange

    async def _settled(self, call: Call, chain: Chain | None) -> None:
        names = (*call.route.members, *(chain.entries if chain is not None else ()))
        backend = self._backends.get(call.route.backend)
        patience = backend.config.max_wait_s if backend is not None else DEFAULT_PATIENCE_S
        await self._rebuilds.settled(names, patience)

    def _hint_tool_parser(self, exchange: Exchange) -> None:
        """A local vLLM's refusal of tools for want of `--enable-auto-tool-choice
        --tool-call-parser` gets the hint appended (`app.routing.tool_hint`), relayed with
        vLLM's status and envelope; logged once per backend. Any other 400 is untouched."""
        response = exchange.response
        name = exchange.backend
        if name not in self._backends or not response.complete or not is_json(response.headers):
            return
        body = hinted(response.first_chunk, name)
        if body is None:
            return
        if name not in self._tool_hinted:
            self._tool_hinted.add(name)
            logger.warning(
                "backend refused a request with tools: its vLLM runs without tool calling "
                "backend=%s hint=%s",
                name, hint(name).strip(" ()"),
            )  # fmt: skip
        kept = [(k, v) for k, v in response.headers if k != b"content-length"]
        relayed = BufferedResponse(400, body)
        relayed.headers = [*kept, (b"content-length", str(len(body)).encode())]
        response.release()  # read to its end: the connection goes back to the pool
        exchange.response = relayed

    def _remember(self, call: Call, exchange: Exchange) -> None:
        """Remember the id of the response `exchange` creates, with the entry creating it."""
        if call.api is Api.RESPONSES and call.method == "POST" and exchange.response.status == 200:
            created = created_response_id(exchange.response.first_chunk)
            if created is not None:
                key = None if call.key is None else call.key.key.name
                self.response_ids.remember(created, exchange.backend, call.route, key)

    def _explain_not_stored(self, call: Call, exchange: Exchange, response_id: str | None) -> None:
        """A local vLLM's 404 for a stored response (a follow-up of `response_id`, or a
        create naming `previous_response_id`) becomes `ResponseNotFound` saying the server
        must keep responses (VLLM_ENABLE_RESPONSES_API_STORE=1); the id is forgotten."""
        if exchange.response.status != 404 or exchange.backend not in self._backends:
            return
        error = not_stored(call, exchange.backend, exchange.response, response_id)
        if error is None:
            return
        exchange.finish()
        if response_id is not None:
            self.response_ids.forget(response_id)
        raise error

    def is_local(self, entry: str) -> bool:
        """Whether `entry` is a local backend (a vLLM server), not a cloud provider."""
        return entry in self._backends

    def pinned_entry(self, route: Route, response_id: str, key: str | None) -> str | None:
        """Where a create continuing `response_id` (`previous_response_id`) must go: the
        entry that created it, when that entry serves `route` (one of its members or of its
        chain's entries); None: routed as usual (an id the gateway does not know, or made
        with another model). `ResponseNotFound` for an id another client key created."""
        stored = self.response_ids.lookup(response_id)
        if stored is None:
            return None
        if stored.key is not None and stored.key != key:
            raise ResponseNotFound(response_id)
        if stored.entry in route.members:
            return stored.entry
        chain = self._chains.get(route.name)
        if chain is None:
            return None
        backend = self._backends.get(stored.entry)
        group = None if backend is None else backend.config.replica_of
        if stored.entry in chain.entries or (group is not None and group in chain.entries):
            return stored.entry
        return None

    def can_serve(self, route: Route, api: Api) -> bool:
        """Whether the backend of `route`, or an entry of its chain, serves `api` as is."""
        chain = self._chains.get(route.name)
        if chain is not None and self._cloud is not None:
            return any(self._cloud.serves(entry, api) for entry in chain.entries)
        return self._backend(route.backend).serving.serves(api)

    def serves_everywhere(self, route: Route, api: Api) -> bool:
        """Whether every target `route` may reach (its backend or replica group, or every
        entry of its chain) serves `api` as is: then no translation can be needed."""
        chain = self._chains.get(route.name)
        if chain is not None and self._cloud is not None:
            return all(self._cloud.serves(entry, api) for entry in chain.entries)
        return all(self._backend(name).serving.serves(api) for name in route.members)

    def stored_response(self, response_id: str, key: str | None = None) -> StoredAt:
        """Where a response created through the gateway lives; `ResponseNotFound` if unknown
        or created by another client key than `key` (a key sees only its own)."""
        stored = self.response_ids.lookup(response_id)
        if stored is None or (stored.key is not None and stored.key != key):
            raise ResponseNotFound(response_id)
        return stored

    async def open_stored(
        self, response_id: str, entry: str, call: Call, notice: Notice | None = None
    ) -> Exchange:
        """Open a follow-up of the stored response `response_id` (or a create continuing
        it) on the entry that created it (a backend or a provider), bypassing routing. A
        delete that succeeds, or finds the response gone, forgets the id; so does a local
        vLLM's 404, explained (`_explain_not_stored`)."""
        if entry in self._backends:
            backend = self._backends[entry]
            if backend.serving.serves_route(call.method, call.path) is False:
                raise route_not_served(call, entry, backend.serving.methods_of(call.path))
            on_wait = None if notice is None else notice.for_backend(entry)
            exchange = await self._open_backend(entry, call, on_wait)
        else:
            provider = self._cloud.providers.get(entry) if self._cloud is not None else None
            if provider is None:  # the configuration changed since
                raise ResponseNotFound(response_id)
            response = await provider.open(call.provider_request(), provider.first_byte_s)
            exchange = Exchange(call.route, entry, response, None, cloud=True)
        status = exchange.response.status
        if call.method == "DELETE" and (200 <= status < 300 or status == 404):
            self.response_ids.forget(response_id)
        self._explain_not_stored(call, exchange, response_id)
        self._remember(call, exchange)
        return exchange

    async def _open_group(self, group: str, call: Call, notice: Notice | None) -> Exchange:
        """Open `call` on the member of `group` the pick chooses; on a failure before the
        first byte (refused, unreachable, 5xx; not a wake that outlasted `max_wait_s`),
        once more on another. The last attempt's answer or error is the request's."""
        route = call.route
        attempts = MemberAttempts(self.replicas, group, route.members, route.backend)
        while True:
            name = attempts.current
            on_wait = None if notice is None else notice.for_backend(name)
            try:
                exchange = await self._open_backend(name, call, on_wait)
            except WakeTimeout:  # waited its max_wait_s already: not once more elsewhere
                raise
            except UpstreamError:
                if attempts.retry() is None:
                    raise
                continue
            if exchange.response.status < 500 or attempts.retry() is None:
                return exchange
            exchange.finish()

    def _backend(self, name: str) -> RoutedBackend:
        """The backend `name` is now. A request routed on a plane a reload has replaced
        since (`app.routing.plane`) may name one the reload removed: refused as the
        reload's block refused it while it was drained."""
        backend = self._backends.get(name)
        if backend is None:
            raise removed(name)
        return backend

    async def _open_backend(self, name: str, call: Call, notice: WaitNotice | None) -> Exchange:
        backend = self._backend(name)
        if call.for_target(backend.serving.serves) is None:
            raise not_served(call, name, backend.serving.apis)
        lease = await backend.requests.acquire(notice, priority=call.priority, share=call.share)
        target = served_target(call, backend, lease)
        if target is None:
            raise not_served(call, name, backend.serving.apis)
        await self._with_adapter(backend, target[0], lease)
        opened = await open_entry(backend, lease, target, self._metrics.upstream_errors)
        return Exchange(
            call.route,
            backend.name,
            await opened.relayable(backend.upstream.timeouts.first_byte_s),
            lease,
            headers=opened.headers or None,
            tokens=self._tokens.get(backend.name),
        )

    async def _with_adapter(self, backend: RoutedBackend, call: Call, lease: Lease) -> None:
        """Load the LoRA adapter `call` names on `backend` unless it is loaded
        (`app.lifecycle.adapters`); the lease is released if it cannot be."""
        route = call.route
        if (
            route.adapter is None
            or not backend.config.adapters
            or call.payload.get("model") is None
        ):
            return
        try:
            await backend.adapters.ensure(
                route.upstream_model, route.adapter, backend.adapters_epoch
            )
        except BaseException as exc:
            lease.release()
            if isinstance(exc, UpstreamError):
                self._metrics.upstream_errors.labels(backend.name, exc.kind).inc()
            raise

    def record_stream_error(self, exchange: Exchange, exc: UpstreamError) -> None:
        if exchange.backend in self._backends:
            self._metrics.upstream_errors.labels(exchange.backend, exc.kind).inc()
        if exchange.hooks is not None:
            exchange.hooks.stream_failed(exchange, exc)


def not_served(call: Call, backend: str, serves: frozenset[Api]) -> EndpointNotServed:
    listed = ", ".join(sorted(serves))
    api = str(call.api)
    if call.translated is not None:  # Ollama's and Anthropic's APIs: served as another
        api += f", nor {call.translated.call.api} it translates to"
    return EndpointNotServed(
        f"The model '{call.route.name}' is served by backend '{backend}', which does not "
        f"serve {call.path} ({api}); it serves: {listed}. What a backend serves is "
        "what its server's /openapi.json lists, else its `task:` or `runner:`; "
        "`endpoints:` in models.yaml overrides both."
    )


def route_not_served(call: Call, backend: str, methods: list[str]) -> GatewayError:
    """A route the backend's server does not have (its /openapi.json): 405 with `Allow`
    when the path has other methods there, else 404 `endpoint_not_served`."""
    path = call.path.split("?", 1)[0]
    message = (
        f"Backend '{backend}' has no {call.method} {path}: its server does not list that "
        "route (vLLM serves GET /v1/responses/{id} and POST /v1/responses/{id}/cancel, "
        "not DELETE or input_items)."
    )
    if methods:
        return MethodNotAllowed(message, headers={"allow": ", ".join(methods)})
    return EndpointNotServed(message)
