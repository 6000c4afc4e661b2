"""What every cloud provider offers the fallback chain, and the request it is given;
`HttpProvider`, the part both kinds of provider (openai_compat.py, anthropic/provider.py)
share: their HTTP upstream, the APIs they serve, closing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from app.jsonwire import json_bytes
from app.settings import TimeoutsConfig
from app.settings.cloud import ProviderConfig
from app.settings.endpoints import Api
from app.upstreams.http import HttpUpstream, Relayable
from app.upstreams.multipart import boundary_of, replace_field


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """A client request as a provider needs it: the parsed body, and the raw one for a
    form (an upload is relayed as sent, with only its `model` field replaced)."""

    path: str  # the gateway's path, e.g. /v1/chat/completions
    payload: dict[str, Any]  # the JSON body; for a form, its text fields
    stream: bool
    api: Api = Api.CHAT
    method: str = "POST"
    raw: bytes = b""  # the body as the client sent it (a form's files included)
    content_type: str = "application/json"

    @property
    def include_usage(self) -> bool:
        options = self.payload.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def body_for(self, model: str) -> bytes:
        """The body with `model` replaced (what an OpenAI-compatible upstream gets)."""
        if self.method != "POST":
            return b""
        return body_with_model(self.payload, self.raw, self.content_type, model)


def body_with_model(payload: dict[str, Any], raw: bytes, content_type: str, model: str) -> bytes:
    """A request body naming another `model`: a form's `model` field replaced in the raw
    bytes (files untouched), a JSON body written again from `payload`."""
    boundary = boundary_of(content_type)
    if boundary is not None:
        return replace_field(raw, boundary, "model", model)
    return json_bytes({**payload, "model": model})


class Provider(Protocol):
    name: str
    kind: str  # "openai" | "anthropic"
    first_byte_s: float  # its own first-byte timeout (a chain may give an attempt less)

    def supports(self, api: Api) -> bool:
        """Whether it serves this API at all (skipped otherwise)."""

    async def open(self, request: ProviderRequest, first_byte_s: float) -> Relayable:
        """Send the request; return once the first content is in (within `first_byte_s`).

        Raises `UpstreamError` for transport failures and `InvalidRequest` when the
        request cannot be expressed in the provider's API."""

    async def close(self) -> None: ...


class HttpProvider:
    """A provider reached over one `HttpUpstream` to its `base_url`, with the configured
    `headers` and those `_key_headers` makes of its key (never logged: `HttpUpstream`
    keeps them); it serves the APIs its config lists. A subclass adds `kind` and `open`."""

    role = "provider"  # what its errors call it, with its name

    def __init__(
        self, name: str, config: ProviderConfig, key: str | None, timeouts: TimeoutsConfig
    ) -> None:
        self.name = name
        self.config = config
        self.first_byte_s = timeouts.first_byte_s
        self.upstream = HttpUpstream(
            name,
            config.base_url,
            timeouts,
            max_connections=config.max_connections,
            extra_headers={**config.headers, **self._key_headers(key)},
            role=self.role,
        )

    def _key_headers(self, key: str | None) -> dict[str, str]:
        raise NotImplementedError

    def supports(self, api: Api) -> bool:
        return api in self.config.apis

    async def close(self) -> None:
        await self.upstream.close()
