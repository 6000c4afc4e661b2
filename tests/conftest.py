"""The whole suite: one default TLS context for every httpx client built in the test process.

httpx builds a TLS context for each client it makes (its transport's), loading certifi's CA
bundle: about 30 ms of CPU each, whatever the URL's scheme. A gateway in process makes
several clients and the fakes a few more, so this was a third of the fast tests' CPU time
(`make unit`). Here the default context (`verify=True`, no client certificate) is built once,
by httpx itself, and shared; any other `verify` is built as before. What a client does over
TLS is unchanged: an `ssl.SSLContext` may serve many connections, and none is modified after
it is built. The gateway's own processes (e2e) are not affected.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import httpx._transports.default as httpx_transports
import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_default_tls_context() -> Iterator[None]:
    build = httpx.create_ssl_context  # what the transports call (httpx._config's)

    @functools.cache
    def default(trust_env: bool) -> ssl.SSLContext:
        return build(verify=True, cert=None, trust_env=trust_env)

    def shared(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
        if verify is True and cert is None:
            return default(trust_env)
        return build(verify=verify, cert=cert, trust_env=trust_env)

    with pytest.MonkeyPatch.context() as patch:
        # Raises when httpx renames it: then this speed-up needs a look, not a silent skip.
        patch.setattr(httpx_transports, "create_ssl_context", shared)
        yield
