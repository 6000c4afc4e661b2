"""What every cloud provider offers the fallback chain, and the request it is given."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from app.upstreams.http import Relayable


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """A client request as a provider needs it: the parsed body, not the raw bytes."""

    path: str  # the gateway's path, e.g. /v1/chat/completions
    payload: dict[str, Any]
    stream: bool

    @property
    def include_usage(self) -> bool:
        options = self.payload.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def body_for(self, model: str) -> bytes:
        """The body with `model` replaced (what an OpenAI-compatible upstream gets)."""
        payload = {**self.payload, "model": model}
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


class Provider(Protocol):
    name: str
    kind: str  # "openai" | "anthropic"
    first_byte_s: float  # its own first-byte timeout (a chain may give an attempt less)

    def supports(self, path: str) -> bool:
        """Whether it serves this endpoint at all (skipped otherwise)."""

    async def open(self, request: ProviderRequest, first_byte_s: float) -> Relayable:
        """Send the request; return once the first content is in (within `first_byte_s`).

        Raises `UpstreamError` for transport failures and `InvalidRequest` when the
        request cannot be expressed in the provider's API."""

    async def close(self) -> None: ...
