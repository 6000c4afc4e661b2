"""The OpenAPI schema (`GET /openapi.json`) as the gateway really answers.

FastAPI documents only its own routes; the relayed ones (`app.api.protocol.PROXIED`, the
stored-response follow-ups, `/v1/models`, `/v1/messages`) are plain Starlette routes, so
they are added here. Bodies are described loosely: what the gateway itself checks (`model`,
`stream`, the one field each endpoint cannot do without); the rest is the backend's. Errors
are the envelopes `app.api.handlers` and the dialects write; FastAPI's 422 (which the
gateway never sends: a body it cannot read is a 400) is replaced. Built once, on the first
`GET /openapi.json`; requests never touch it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from fastapi import FastAPI

from app.api.protocol import PROXIED, Endpoint

Json = dict[str, Any]

_ERROR: Final = "#/components/schemas/ErrorEnvelope"
_ANTHROPIC_ERROR: Final = "#/components/schemas/AnthropicErrorEnvelope"
_NULLABLE_STRING: Final = {"anyOf": [{"type": "string"}, {"type": "null"}]}
COMPONENTS: Final[Json] = {
    "ErrorEnvelope": {
        "type": "object",
        "description": "OpenAI's error envelope; every error the gateway writes.",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": _NULLABLE_STRING,
                    "code": _NULLABLE_STRING,
                },
            }
        },
    },
    "AnthropicErrorEnvelope": {
        "type": "object",
        "description": "Anthropic's error envelope (`/v1/messages*`).",
        "required": ["type", "error"],
        "properties": {
            "type": {"type": "string", "enum": ["error"]},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}
_JSON_TYPES: Final = {str: "string", list: "array", dict: "object", bool: "boolean"}


def _errors(ref: str) -> Json:
    content = {"application/json": {"schema": {"$ref": ref}}}
    return {
        "4XX": {"description": "Refused by the gateway (or the backend).", "content": content},
        "5XX": {"description": "No backend could answer.", "content": content},
    }


def _relayed(ref: str = _ERROR) -> Json:
    return {
        "200": {
            "description": "The backend's answer, relayed (an event stream when `stream`).",
            "content": {"application/json": {"schema": {}}, "text/event-stream": {"schema": {}}},
        },
        **_errors(ref),
    }


def _field(types: tuple[type, ...]) -> Json:
    if not types:
        return {}
    if len(types) == 1:
        return {"type": _JSON_TYPES[types[0]]}
    return {"anyOf": [{"type": _JSON_TYPES[t]} for t in types]}


def _body(endpoint: Endpoint) -> Json:
    required = ["model"] + ([endpoint.required] if endpoint.required else [])
    properties: Json = {"model": {"type": "string", "minLength": 1}}
    if endpoint.form:
        properties |= {"stream": {"type": "string", "enum": ["true", "false"]}}
        if endpoint.required:
            properties[endpoint.required] = {"type": "string", "format": "binary"}
        media = "multipart/form-data"
    else:
        properties |= {"stream": {"type": "boolean"}}
        if endpoint.required:
            properties[endpoint.required] = _field(endpoint.required_types)
        media = "application/json"
    schema: Json = {"type": "object", "required": required, "properties": properties}
    if endpoint.required and endpoint.instead:  # one of the two, e.g. `input` or `messages`
        properties[endpoint.instead] = _field(endpoint.instead_types)
        schema["required"] = ["model"]
        schema["anyOf"] = [{"required": [endpoint.required]}, {"required": [endpoint.instead]}]
    return {"required": True, "content": {media: {"schema": schema}}}


def _post(summary: str, body: Json, tag: str, ref: str = _ERROR) -> Json:
    return {"tags": [tag], "summary": summary, "requestBody": body, "responses": _relayed(ref)}


def _get(summary: str, tag: str, parameters: list[Json] | None = None) -> Json:
    operation: Json = {"tags": [tag], "summary": summary, "responses": _relayed()}
    if parameters:
        operation["parameters"] = parameters
    return operation


def _path_param(name: str) -> Json:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def relayed_paths() -> Json:
    """The path items of the Starlette routes."""
    paths: Json = {
        endpoint.path: {
            "post": _post(f"Relayed by `model` ({endpoint.api})", _body(endpoint), "openai")
        }
        for endpoint in PROXIED
    }
    stored = [_path_param("response_id")]
    paths["/v1/responses/{response_id}"] = {
        "get": _get("A stored response, from the backend that made it", "openai", stored),
        "delete": _get("Delete a stored response", "openai", stored),
    }
    paths["/v1/responses/{response_id}/cancel"] = {
        "post": {**_get("Cancel a background response", "openai", stored)}
    }
    paths["/v1/responses/{response_id}/input_items"] = {
        "get": _get("A stored response's input items", "openai", stored)
    }
    paths["/v1/models"] = {"get": _get("The models and aliases served", "openai")}
    paths["/v1/models/{model}"] = {
        "get": _get("One model or alias", "openai", [_path_param("model")])
    }
    anthropic = {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "messages": {"type": "array"},
            "max_tokens": {"type": "integer"},
            "stream": {"type": "boolean"},
        },
    }
    body = {"required": True, "content": {"application/json": {"schema": anthropic}}}
    paths["/v1/messages"] = {
        "post": _post("Anthropic's Messages API", body, "anthropic", _ANTHROPIC_ERROR)
    }
    paths["/v1/messages/count_tokens"] = {
        "post": _post("Count a Messages request's tokens", body, "anthropic", _ANTHROPIC_ERROR)
    }
    return paths


def _real_errors(paths: Json) -> None:
    """FastAPI's own operations: its 422 becomes the gateway's 4XX/5XX envelopes."""
    for item in paths.values():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status, response in _errors(_ERROR).items():
                responses.setdefault(status, response)


def complete(schema: Json) -> Json:
    """FastAPI's schema with the relayed routes and the real error envelopes added."""
    paths = schema.setdefault("paths", {})
    _real_errors(paths)
    paths.update(relayed_paths())
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas.update(COMPONENTS)
    return schema


def install(app: FastAPI) -> None:
    """`app.openapi()` returns the completed schema, built on first use and cached."""
    fastapi_schema: Callable[[], Json] = app.openapi

    def openapi() -> Json:
        if app.openapi_schema is None:
            app.openapi_schema = complete(fastapi_schema())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
