"""The data plane's front door: a routed model request goes straight to its handler.

FastAPI wraps every request in half a dozen layers (server errors, exception telemetry,
a body limit, exception handlers, an exit stack, route matching over every route) that
the admin surface uses and the model APIs do not: those read their own body under
`max_body_bytes`, render their own errors and match by exact path. `FastPath` sends a
`POST` to one of their paths to its handler directly and everything else on to FastAPI;
`RequestObserver` (request id, metrics, the access line), `BodyGuard` (every body
bounded in size and time) and `OriginGuard` (browser pages of other sites) sit in front
of both, so no route escapes them.

What FastAPI's layers would have done is done here: a `GatewayError` becomes its error
response (the handlers of the Messages API render their own, in Anthropic's envelope), a
client that left before its body was read is counted as gone (499) and not answered, an
unexpected exception is logged and answered 500 `internal_error` (or, after the status
line went out, propagates to the server, which closes the connection).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from fastapi import FastAPI
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.access.origins import OriginPolicy
from app.activity import Activity
from app.api.handlers import client_gone, error_response
from app.api.middleware import BodyGuard, RequestObserver
from app.api.origin_guard import OriginGuard
from app.errors import GatewayError
from app.metrics import Metrics

logger = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]


def post_handlers(routes: Iterable[BaseRoute]) -> dict[str, Handler]:
    """The `POST`-only routes without path parameters, by path."""
    found: dict[str, Handler] = {}
    for route in routes:
        if isinstance(route, Route) and route.methods == {"POST"} and "{" not in route.path:
            found[route.path] = route.endpoint
    return found


class FastPath:
    def __init__(self, app: FastAPI, handlers: Mapping[str, Handler], rest: ASGIApp) -> None:
        self._app = app
        self._handlers = dict(handlers)
        self._rest = rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = (
            self._handlers.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if handler is None:
            await self._rest(scope, receive, send)
            return
        scope["app"] = self._app
        try:
            response = await handler(Request(scope, receive))
        except GatewayError as err:
            response = error_response(err)
        except ClientDisconnect:
            client_gone(scope)
            return
        except Exception:
            logger.exception("unhandled error path=%s", scope["path"])
            response = error_response(GatewayError("The gateway failed unexpectedly; see its log."))
        await response(scope, receive, send)


class GatewayApp(FastAPI):
    """FastAPI for everything but the routed model APIs, which take the `FastPath`."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        access_log: bool,
        max_body_bytes: int,
        body_timeout_s: float,
        fast_routes: Iterable[BaseRoute],
        origins: OriginPolicy,
        client_keys: bool,
        admin_key: bool,
        activity: Activity | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._observer_metrics = metrics
        self._activity = activity
        self._access_log = access_log
        self._body_limits = (max_body_bytes, body_timeout_s)
        self._fast = post_handlers(fast_routes)
        self._origins = (origins, client_keys, admin_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An HTTP request goes straight to the stack built at start-up: FastAPI's own
        `__call__` asks OpenTelemetry's three global providers on every request whether its
        telemetry is on (the gateway configures none; its metrics are Prometheus'), and
        Starlette's sets `scope["app"]`, as here."""
        stack = self.middleware_stack
        if scope["type"] == "http" and stack is not None and not self.root_path:
            scope["app"] = self
            await stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        rest = super().build_middleware_stack()
        max_body_bytes, body_timeout_s = self._body_limits
        policy, client_keys, admin_key = self._origins
        admitted = OriginGuard(
            FastPath(self, self._fast, rest),
            policy=policy,
            client_keys=client_keys,
            admin_key=admin_key,
        )
        guarded = BodyGuard(
            admitted,
            max_body_bytes=max_body_bytes,
            body_timeout_s=body_timeout_s,
        )
        return RequestObserver(
            guarded,
            metrics=self._observer_metrics,
            access_log=self._access_log,
            activity=self._activity,
        )
