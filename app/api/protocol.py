"""Just enough of OpenAI's request format to route a request. Pure: no I/O, no FastAPI.

The body is checked for the fields the gateway relies on (`model`, `stream`) and for the
one field each endpoint cannot do without; everything else is the upstream's to judge,
so its 400s reach the client unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from app.errors import ErrorCode, InvalidRequest
from app.routing.registry import Route


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # metric label
    path: str  # same path upstream
    required: str  # the field this endpoint cannot do without
    required_types: tuple[type, ...]


CHAT: Final = Endpoint("chat_completions", "/v1/chat/completions", "messages", (list,))
COMPLETIONS: Final = Endpoint("completions", "/v1/completions", "prompt", (str, list))
EMBEDDINGS: Final = Endpoint("embeddings", "/v1/embeddings", "input", (str, list))
ENDPOINT_BY_PATH: Final = {e.path: e.name for e in (CHAT, COMPLETIONS, EMBEDDINGS)} | {
    "/v1/models": "models"
}


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    model: str
    stream: bool
    payload: dict[str, Any]
    raw: bytes


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, whatever content-type the client labelled it with
    (curl's `-d` says form); `invalid_json` otherwise."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        detail = (
            f" ({exc.msg} at line {exc.lineno} column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else ""
        )
        raise InvalidRequest(
            f"The request body is not valid JSON{detail}.", code=ErrorCode.INVALID_JSON
        ) from None
    if not isinstance(payload, dict):
        raise InvalidRequest("The request body must be a JSON object.", code=ErrorCode.INVALID_JSON)
    return payload


def parse_request(body: bytes, endpoint: Endpoint) -> ParsedRequest:
    payload = json_object(body)
    model = payload.get("model")
    if model is None:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest.wrong_type("model", "a non-empty string", model)
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest.wrong_type("stream", "a boolean", stream)
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest.wrong_type("stream_options", "an object", options)
    if endpoint.required not in payload:
        raise InvalidRequest(
            f"Missing required parameter: '{endpoint.required}'.", param=endpoint.required
        )
    value = payload[endpoint.required]
    if not isinstance(value, endpoint.required_types):
        wanted = " or ".join(_TYPE_NAMES[t] for t in endpoint.required_types)
        raise InvalidRequest.wrong_type(endpoint.required, wanted, value)
    return ParsedRequest(model=model, stream=stream, payload=payload, raw=body)


def upstream_body(request: ParsedRequest, route: Route) -> bytes:
    """The body to send upstream: unchanged unless the client named an alias."""
    if not route.rewrites:
        return request.raw
    payload = dict(request.payload)
    payload["model"] = route.upstream_model
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


_TYPE_NAMES: Final = {list: "an array", str: "a string", dict: "an object", bool: "a boolean"}
