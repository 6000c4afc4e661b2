"""The whole suite: one default TLS context for every httpx client built in the test process,
and a garbage collection at the end of each test module.

httpx builds a TLS context for each client it makes (its transport's), loading certifi's CA
bundle: about 30 ms of CPU each, whatever the URL's scheme. A gateway in process makes
several clients and the fakes a few more, so this was a third of the fast tests' CPU time
(`make unit`). Here the default context (`verify=True`, no client certificate) is built once,
by httpx itself, and shared; any other `verify` is built as before. What a client does over
TLS is unchanged: an `ssl.SSLContext` may serve many connections, and none is modified after
it is built. The gateway's own processes (e2e) are not affected.

A socket or transport left open in a reference cycle is only found (a ResourceWarning, an
error under `filterwarnings = error`) when the collector next runs, in whatever test that
is: a leak surfaced in an unrelated later test's teardown (issue 35, item 7). The collector
now runs after the last test of each module, before pytest takes up what it found, so a
leak is reported by a test of the module that made it (`PYTHONTRACEMALLOC=20` adds where
the socket was made). What the import and collection made is frozen first (`gc.freeze`),
so each of these collections scans only what the tests made since.
"""

from __future__ import annotations

import functools
import gc
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


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()  # the modules, the app, the collected tests: never scanned again


@pytest.fixture(autouse=True, scope="module")
def _collect_after_the_module() -> Iterator[None]:
    """Set up before the module's other fixtures, so torn down after them: in its last
    test's teardown, before pytest takes up what the collection found."""
    yield
    gc.collect()
