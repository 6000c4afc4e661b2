"""The control plane's HTTP client library, behind one module.

httpx serves the control plane (the Docker and Kubernetes APIs, vLLM's health, sleep mode
and `/metrics`, Prometheus, the CLI's admin calls); the data plane relays through aiohttp
(`app.upstreams.http`). httpx has had no release since 2024-12, so it is imported here and
nowhere else in `app` (tests/unit/test_layout.py checks it): moving to a maintained fork
with the same API is a change of this module alone. Tests may still build httpx's
transports (respx, `MockTransport`, `ASGITransport`) and pass them in as `AsyncBaseTransport`.

Every client is built by `async_client` or `sync_client`, whose `timeout` has no default: each
caller says how long a call may wait (`Timeout(None, connect=...)` where a stream has no
read limit). `DEFAULT_TIMEOUT_S` is httpx's own default, for callers that took it.

Errors callers catch, as httpx draws them:

    HTTPError
    ├── TransportError
    │   ├── TimeoutException: ConnectTimeout, ReadTimeout, WriteTimeout, PoolTimeout
    │   └── NetworkError: ConnectError, ...
    └── ...
    InvalidURL, StreamError (not HTTPError subclasses)
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import TypeAlias

import httpx
from httpx import (
    AsyncBaseTransport,
    AsyncClient,
    AsyncHTTPTransport,
    Client,
    ConnectError,
    ConnectTimeout,
    HTTPError,
    InvalidURL,
    PoolTimeout,
    Response,
    StreamError,
    Timeout,
    TimeoutException,
    TransportError,
    WriteTimeout,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "AsyncBaseTransport",
    "AsyncClient",
    "AsyncHTTPTransport",
    "Client",
    "ConnectError",
    "ConnectTimeout",
    "HTTPError",
    "InvalidURL",
    "PoolTimeout",
    "Response",
    "StreamError",
    "Timeout",
    "TimeoutException",
    "TransportError",
    "WriteTimeout",
    "async_client",
    "sync_client",
]

# httpx's default for every phase (connect, read, write, pool) when none is given.
DEFAULT_TIMEOUT_S = 5.0

TimeoutArg: TypeAlias = Timeout | float | None
Verify: TypeAlias = ssl.SSLContext | bool


def async_client(
    *,
    timeout: TimeoutArg,
    base_url: str = "",
    transport: AsyncBaseTransport | None = None,
    headers: Mapping[str, str] | None = None,
    verify: Verify = True,
    trust_env: bool = True,
) -> AsyncClient:
    """An async client; `transport` replaces the network (tests, a Unix socket)."""
    return httpx.AsyncClient(
        base_url=base_url,
        transport=transport,
        timeout=timeout,
        headers=headers,
        verify=verify,
        trust_env=trust_env,
    )


def sync_client(
    *,
    timeout: TimeoutArg,
    base_url: str = "",
    headers: Mapping[str, str] | None = None,
) -> Client:
    """A blocking client, for the command line."""
    return httpx.Client(base_url=base_url, timeout=timeout, headers=headers)
