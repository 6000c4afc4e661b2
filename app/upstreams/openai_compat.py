"""An OpenAI-compatible cloud provider (DeepSeek, a serverless vLLM, OpenAI itself).

Same relay as a local backend: the body goes out with `model` replaced by the provider's,
the key as a bearer token, and the answer comes back byte for byte. What differs:

- the client's headers are not forwarded to a third party: the request carries only
  `content-type`, `accept`, the key and the provider's configured `headers` (no
  `accept-encoding` either, so answers arrive uncompressed and their usage is readable);
- of the provider's response headers only `content-type`, `retry-after`,
  `retry-after-ms` and `x-ratelimit-*` reach the client (no `set-cookie` from a CDN,
  no provider request ids mixed with ours).
"""

from __future__ import annotations

from typing import Final

from app.settings.endpoints import Api
from app.upstreams.http import Relayable
from app.upstreams.provider import HttpProvider, ProviderRequest

_KEPT: Final = frozenset({b"content-type", b"retry-after", b"retry-after-ms"})


class OpenAIProvider(HttpProvider):
    kind = "openai"

    def _key_headers(self, key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    async def open(self, request: ProviderRequest, first_byte_s: float) -> Relayable:
        if request.stream:
            accept = "text/event-stream"
        else:
            accept = "*/*" if request.api is Api.SPEECH else "application/json"
        headers = {"accept": accept}
        if request.method == "POST":
            headers["content-type"] = request.content_type
        response = await self.upstream.open(
            request.path.removeprefix("/v1"),
            request.body_for(self.config.model),
            headers,
            first_byte_s=first_byte_s,
            method=request.method,
        )
        response.headers = [
            (name, value)
            for name, value in response.headers
            if name in _KEPT or name.startswith(b"x-ratelimit-")
        ]
        return response
