"""The gateway and a fake vLLM on an event loop of their own thread, for synchronous
callers (hypothesis and schemathesis tests, which draw examples outside any loop)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import httpx

from app.settings import Settings
from tests.fakes.servers import FakeServer, Gateway, fake_vllm, gateway

T = TypeVar("T")


class LoopThread:
    """An event loop running in a thread of its own: `run(coro)` from synchronous code,
    `enter(cm)` for async context managers, all closed by `close()`."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def enter(self, cm: contextlib.AbstractAsyncContextManager[T]) -> T:
        return self.run(self._stack.enter_async_context(cm))

    def close(self) -> None:
        try:
            self.run(self._stack.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


class ThreadedGateway:
    """`with ThreadedGateway(settings_for) as gw: gw.request(...)`; `settings_for` gets the
    fake vLLM's URL."""

    def __init__(self, settings_for: Callable[[str], Settings], **fake_options: Any) -> None:
        self._settings_for = settings_for
        self._fake_options = fake_options
        self._thread: LoopThread | None = None
        self.gw: Gateway | None = None
        self.upstream: FakeServer | None = None

    def __enter__(self) -> ThreadedGateway:
        self._thread = LoopThread()
        self.upstream = self._thread.enter(fake_vllm(**self._fake_options))
        self.gw = self._thread.enter(gateway(self._settings_for(self.upstream.url)))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._thread.close()

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | Mapping[bytes, bytes] | None = None,
        content: bytes | None = None,
        params: Any = None,
        timeout: float = 20,
    ) -> httpx.Response:
        assert self.gw is not None
        client = self.gw.client
        call = client.request(
            method, url, headers=headers, content=content, params=params, timeout=timeout
        )
        assert self._thread is not None
        return self._thread.run(call, timeout + 5)
