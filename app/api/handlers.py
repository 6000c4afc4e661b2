"""The one place a `GatewayError` (or any other failure) becomes an HTTP response; and where
a client that left before its request body was read is told apart from a failure."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from app.api.middleware import CLIENT_CLOSED, context_of
from app.errors import GatewayError, InvalidRequest, MethodNotAllowed, NotFound
from app.jsonwire import json_bytes

logger = logging.getLogger(__name__)


class JSONBody(JSONResponse):
    """Starlette's `JSONResponse`, written by `json_bytes`: text a client sent (a lone
    surrogate) can never make rendering fail. The gateway's default response class."""

    def render(self, content: Any) -> bytes:
        return json_bytes(content)


def error_response(err: GatewayError) -> JSONResponse:
    return JSONBody(err.body(), status_code=err.status, headers=err.headers or None)


async def _gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return error_response(exc)


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    err: GatewayError
    if exc.status_code == 404:
        err = NotFound(f"No route for {request.method} {request.url.path}.")
    elif exc.status_code == 405:
        err = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}.")
    else:
        err = InvalidRequest(str(exc.detail), code=f"http_{exc.status_code}")
    headers = {**err.headers, **(exc.headers or {})}
    return JSONBody(err.body(), status_code=exc.status_code, headers=headers or None)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    message = f"{loc}: {first.get('msg', 'invalid')}" if loc else str(first.get("msg", "invalid"))
    return error_response(InvalidRequest(f"Invalid request: {message}", param=loc or None))


def client_gone(scope: Scope) -> None:
    """The client closed its connection before its request body was all read: nobody is
    left to answer. Counted as a client's close (499), logged without a traceback."""
    context_of(scope).client_gone = True
    logger.info("client disconnected before its request body was read path=%s", scope["path"])


async def _client_disconnect(request: Request, exc: Exception) -> Response:
    client_gone(request.scope)
    return Response(status_code=CLIENT_CLOSED)  # written to no one


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled error path=%s", request.url.path, exc_info=exc)
    return error_response(GatewayError("The gateway failed unexpectedly; see its log."))


def install(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(HTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ClientDisconnect, _client_disconnect)
    app.add_exception_handler(Exception, _unexpected)
