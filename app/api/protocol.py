"""Just enough of OpenAI's request format to route a request. Pure: no I/O, no FastAPI.

The body is checked for the fields the gateway relies on (`model`, `stream`) and for the
one field each endpoint cannot do without; everything else is the upstream's to judge,
so its 400s reach the client unchanged.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

from app.errors import ErrorCode, InvalidRequest
from app.jsonwire import too_deep
from app.settings.endpoints import Api
from app.upstreams.multipart import boundary_of, form_fields, part_names


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # metric label
    path: str  # same path upstream
    api: Api  # what a backend must serve to take it
    required: str | None = None  # the field this endpoint cannot do without
    required_types: tuple[type, ...] = ()
    form: bool = False  # multipart/form-data (an upload), not JSON
    # A field that may stand in for `required` (vLLM's chat form of a pooling request:
    # `messages` instead of `input`), with its types.
    instead: str | None = None
    instead_types: tuple[type, ...] = ()


_TEXT: Final = (str, list)
# vLLM 0.33 takes a pooling request in two forms: `input` (CompletionRequestMixin) or chat
# `messages` (ChatRequestMixin), in vllm/entrypoints/pooling/base/protocol.py; the
# embeddings and classify requests are unions of both (pooling/embed/protocol.py
# `EmbeddingRequest`, pooling/classify/protocol.py `ClassificationRequest`): `instead`.
# A rerank `query` is a `ScoreInput`: a string or a multimodal object (`{"content": [...]}`,
# vllm/entrypoints/pooling/scoring/typing.py `ScoreMultiModalParam`).
_SCORE_INPUT: Final = (str, dict)
CHAT: Final = Endpoint("chat_completions", "/v1/chat/completions", Api.CHAT, "messages", (list,))
COMPLETIONS: Final = Endpoint("completions", "/v1/completions", Api.COMPLETIONS, "prompt", _TEXT)
EMBEDDINGS: Final = Endpoint(
    "embeddings",
    "/v1/embeddings",
    Api.EMBEDDINGS,
    "input",
    _TEXT,
    instead="messages",
    instead_types=(list,),
)
RESPONSES: Final = Endpoint("responses", "/v1/responses", Api.RESPONSES)
# Routed by `model` like chat; vLLM's names and paths (its pooling and tokenizer routers).
PROXIED: Final = (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    RESPONSES,
    Endpoint("rerank", "/v1/rerank", Api.RERANK, "query", _SCORE_INPUT),
    Endpoint("rerank", "/rerank", Api.RERANK, "query", _SCORE_INPUT),
    Endpoint("rerank", "/v2/rerank", Api.RERANK, "query", _SCORE_INPUT),
    Endpoint("score", "/v1/score", Api.SCORE),
    Endpoint("score", "/score", Api.SCORE),
    Endpoint("tokenize", "/tokenize", Api.TOKENIZE),
    Endpoint("detokenize", "/detokenize", Api.DETOKENIZE, "tokens", (list,)),
    Endpoint("pooling", "/pooling", Api.POOLING),
    Endpoint(
        "classify",
        "/classify",
        Api.CLASSIFY,
        "input",
        _TEXT,
        instead="messages",
        instead_types=(list,),
    ),
    Endpoint(
        "audio_transcriptions", "/v1/audio/transcriptions", Api.TRANSCRIPTIONS, "file", form=True
    ),
    Endpoint("audio_translations", "/v1/audio/translations", Api.TRANSLATIONS, "file", form=True),
    Endpoint("audio_speech", "/v1/audio/speech", Api.SPEECH, "input", (str,)),
    Endpoint("images_generations", "/v1/images/generations", Api.IMAGES, "prompt", (str,)),
    Endpoint("images_edits", "/v1/images/edits", Api.IMAGES, "image", form=True),
)
ENDPOINT_BY_PATH: Final = {e.path: e.name for e in PROXIED} | {
    "/v1/models": "models",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages_count_tokens",
    # Ollama's API (app.api.ollama): its model calls, and its listings.
    "/api/chat": "ollama_chat",
    "/api/generate": "ollama_generate",
    "/api/embed": "ollama_embed",
    "/api/show": "models",
    "/api/tags": "models",
    "/api/ps": "models",
}
_FORM_FIELDS: Final = frozenset({"model", "stream"})


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    model: str
    stream: bool
    payload: dict[str, Any]  # the JSON body; for a form, its text fields
    raw: bytes
    content_type: str = "application/json"


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, whatever content-type the client labelled it with
    (curl's `-d` says form); `invalid_json` otherwise.

    Stricter than Python's `json`, as OpenAI is: `NaN`/`Infinity` and numbers out of a
    double's range (`1e999`) are refused, not read as nan/inf; so is nesting deeper than
    the interpreter can parse (a `RecursionError`) and an integer of more digits than
    Python converts. The body relayed is the client's bytes, never a re-encoding."""
    try:
        # `json.loads` of bytes, with one decoder for every request (`loads` with options
        # builds a new one each call).
        payload = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except _NotFinite as exc:
        raise InvalidRequest(
            f"The request body is not valid JSON: {exc.args[0]}", code=ErrorCode.INVALID_JSON
        ) from None
    except RecursionError:
        raise too_deep() from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        detail = (
            f" ({exc.msg} at line {exc.lineno} column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else " (it is not UTF-8)"
        )
        raise InvalidRequest(
            f"The request body is not valid JSON{detail}.", code=ErrorCode.INVALID_JSON
        ) from None
    except ValueError as exc:  # an integer over `sys.get_int_max_str_digits()` digits
        raise InvalidRequest(
            f"The request body is not valid JSON: a number is too long ({exc}).",
            code=ErrorCode.INVALID_JSON,
        ) from None
    if not isinstance(payload, dict):
        raise InvalidRequest("The request body must be a JSON object.", code=ErrorCode.INVALID_JSON)
    return payload


class _NotFinite(Exception):
    """A number JSON cannot hold (`NaN`, `Infinity`, `1e999`); its message names it."""


def _no_constant(name: str) -> float:
    raise _NotFinite(f"{name} is not a JSON number.")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(f"the number {text[:40]} is out of range.")
    return value


_DECODER: Final = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def parse_request(
    body: bytes, endpoint: Endpoint, content_type: str = "application/json"
) -> ParsedRequest:
    if endpoint.form:
        return parse_form(body, endpoint, content_type)
    payload = json_object(body)
    model = model_of(payload)
    stream = stream_of(payload)
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest.wrong_type("stream_options", "an object", options)
    required, types = endpoint.required, endpoint.required_types
    if required is not None:
        if required not in payload and endpoint.instead in payload:
            required, types = endpoint.instead, endpoint.instead_types
        if required not in payload:
            raise _missing(required, endpoint.instead)
        value = payload[required]
        if not isinstance(value, types):
            wanted = " or ".join(_TYPE_NAMES[t] for t in types)
            raise InvalidRequest.wrong_type(required, wanted, value)
    return ParsedRequest(model=model, stream=stream, payload=payload, raw=body)


def model_of(payload: dict[str, Any]) -> str:
    model = payload.get("model")
    if model is None:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest.wrong_type("model", "a non-empty string", model)
    return model


def stream_of(payload: dict[str, Any]) -> bool:
    """`stream`: absent or null is false; anything but a boolean is refused."""
    stream = payload.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise InvalidRequest.wrong_type("stream", "a boolean", stream)
    return stream


def parse_form(body: bytes, endpoint: Endpoint, content_type: str) -> ParsedRequest:
    """An upload: `model` and `stream` read from the form wherever they sit; the body
    itself is relayed unchanged."""
    boundary = boundary_of(content_type)
    if boundary is None:
        raise InvalidRequest(
            f"{endpoint.path} takes multipart/form-data (a file upload), not "
            f"{content_type.split(';')[0] or 'a body without content-type'}."
        )
    fields = form_fields(body, boundary, _FORM_FIELDS)
    model = fields.get("model")
    if not model:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    stream_text = fields.get("stream", "false").strip().lower()
    if stream_text not in ("true", "false", "1", "0", ""):
        raise InvalidRequest.wrong_type("stream", "a boolean", stream_text)
    if endpoint.required is not None and endpoint.required not in part_names(body, boundary):
        raise _missing(endpoint.required)
    return ParsedRequest(
        model=model,
        stream=stream_text in ("true", "1"),
        payload=dict(fields),
        raw=body,
        content_type=content_type,
    )


def _missing(param: str, instead: str | None = None) -> InvalidRequest:
    either = f" (or '{instead}')" if instead else ""
    return InvalidRequest(f"Missing required parameter: '{param}'{either}.", param=param)


_TYPE_NAMES: Final = {list: "an array", str: "a string", dict: "an object", bool: "a boolean"}
