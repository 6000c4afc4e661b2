"""Fake cloud providers on 127.0.0.1 for fallback tests, in this event loop.

- `fake_openai_provider(key)`: an OpenAI-compatible provider. It is the fake vLLM (its
  `/_fake/faults` fail, stall and drop on demand) behind what a cloud API adds: a bearer
  key (a wrong one gets 401, and, like the worst provider, the message echoes the key it
  got) and answers a test queues with `inject()` (any status, headers, body), used for
  `Retry-After`, 401/403/404/413/422 bodies and in-stream errors. `base_url` ends in /v1,
  as `cloud_providers.yaml` takes it.
- `fake_anthropic(key)`: `app.sim.anthropic` served here.
- `cloud_settings(backends, providers, chains, ...)`: gateway settings with a cloud config.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiohttp import web

from app.settings import Settings
from app.sim.anthropic import AnthropicFaults, FakeAnthropicConfig, FakeAnthropicServer
from app.sim.vllm import FakeConfig, build_app
from tests.fakes.servers import gateway_settings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Injected:
    status: int
    body: bytes
    headers: dict[str, str]


@dataclass
class FakeProvider:
    base_url: str  # with /v1, as a provider is configured
    root: str  # without /v1: the fake's own controls
    key: str
    model: str
    client: httpx.AsyncClient
    calls: int = 0  # requests to /v1/*, whatever came of them
    unauthorized: int = 0
    headers_seen: list[dict[str, str]] = field(default_factory=list)  # minus authorization
    _queue: list[Injected] = field(default_factory=list)

    def inject(
        self,
        status: int,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        count: int = 1,
        content_type: str = "application/json",
    ) -> None:
        """Answer the next `count` requests with this instead of generating."""
        raw = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
        for _ in range(count):
            self._queue.append(
                Injected(status, raw, {"content-type": content_type, **(headers or {})})
            )

    async def set_faults(self, **faults: Any) -> None:
        response = await self.client.post("/_fake/faults", json=faults)
        response.raise_for_status()

    async def stats(self) -> dict[str, Any]:
        response = await self.client.get("/_fake/stats")
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
        return stats

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/v1/"):
            return await handler(request)
        self.calls += 1
        self.headers_seen.append(
            {k.lower(): v for k, v in request.headers.items() if k.lower() != "authorization"}
        )
        auth = request.headers.get("Authorization", "")
        if auth != f"Bearer {self.key}":
            self.unauthorized += 1
            error = {
                "message": f"Incorrect API key provided: {auth.removeprefix('Bearer ')}.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
            return web.json_response({"error": error}, status=401)
        if self._queue:
            injected = self._queue.pop(0)
            await request.read()
            return web.Response(
                status=injected.status, body=injected.body, headers=injected.headers
            )
        return await handler(request)


@asynccontextmanager
async def fake_openai_provider(
    key: str, *, model: str = "cloud-model", **options: Any
) -> AsyncIterator[FakeProvider]:
    # OpenAI's API keeps responses (`store` defaults to true): the fake's store is on.
    app = build_app(FakeConfig(port=0, models=[model], **{"responses_store": True, **options}))
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    provider: FakeProvider | None = None
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            provider = FakeProvider("", "", key, model, client)
            app.middlewares.append(provider.middleware)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            root = f"http://127.0.0.1:{runner.addresses[0][1]}"
            provider.root, provider.base_url = root, root + "/v1"
            client.base_url = httpx.URL(root)
            yield provider
    finally:
        await runner.cleanup()


@asynccontextmanager
async def fake_anthropic(
    key: str | None = None, **faults: Any
) -> AsyncIterator[FakeAnthropicServer]:
    config = FakeAnthropicConfig(api_key=key, faults=AnthropicFaults(**faults))
    async with FakeAnthropicServer(config) as server:
        yield server


def cloud_settings(
    backends: dict[str, dict[str, Any]],
    providers: dict[str, dict[str, Any]],
    chains: dict[str, Any],
    *,
    circuit: dict[str, Any] | None = None,
    **fields: Any,
) -> Settings:
    cloud: dict[str, Any] = {"providers": providers, "chains": chains}
    if circuit is not None:
        cloud["circuit"] = circuit
    return gateway_settings(backends, cloud_providers=cloud, **fields)
