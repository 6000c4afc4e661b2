"""The one error hierarchy of the gateway.

Every failure a client can see is a `GatewayError`; each class knows its HTTP status
and the OpenAI error `type`/`code` it renders as. Rendering happens only in
`app.api.handlers`; transport exceptions never escape `app.upstreams`/`app.runtimes`.

    GatewayError (500, server_error)
    ├── InvalidRequest (400, invalid_request_error)
    │   ├── RequestTimeout (408)                  the body did not arrive within `body_timeout_s`
    │   ├── PayloadTooLarge (413)
    │   ├── UnsupportedMediaType (415)            a compressed (`content-encoding`) request body
    │   └── RequestHeadersTooLarge (431)          request line and headers over `max_header_bytes`
    ├── AuthenticationFailed (401, code invalid_api_key)
    ├── PermissionDenied (403)
    ├── ModelNotFound (404, code model_not_found)
    ├── NotFound (404, code not_found)            unknown path
    │   ├── EndpointNotServed (404)               the model's backend does not serve this API
    │   └── ResponseNotFound (404)                a /v1/responses id the gateway did not route
    ├── MethodNotAllowed (405)
    ├── Conflict (409)                            an admin action the current state forbids
    │   └── YieldNotMet (409)                     a yield's `min_free_mib` not reached: undone
    ├── TooManyConnections (503)                  `max_connections` open, none idle
    ├── GatewayStopping (503)                     the gateway is shutting down (SIGTERM)
    └── UpstreamError (server_error)              the upstream could not answer
        ├── UpstreamBadStatus (502)               a status outside HTTP's 200..599
        ├── UpstreamUnavailable (503)             refused, reset
        │   ├── BackendUnavailable (503)          a local backend cannot serve now: starting
        │   │                                     failed, blocked by a zone, no VRAM, queue full,
        │   │                                     its port taken by another server
        │   ├── AllEntriesCooling (503)           every entry of a fallback chain is skipped
        │   └── FallbackExhausted (503)           no entry of a fallback chain could answer
        └── UpstreamTimeout (504)                 connect, first byte or idle timeout
            ├── WakeTimeout (504)                 a held request waited `max_wait_s`
            └── FallbackDeadline (504)            a chain's `deadline_s` passed

`UpstreamError.kind` is a bounded label (metrics, and the fallback policy's trigger).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Final


class ErrorCode(StrEnum):
    """Every `error.code` the gateway itself writes (a relayed upstream error keeps its own;
    an unexpected Starlette HTTP error is `http_<status>`). Closed: the error table of
    docs/api.md lists these (tests/unit/test_readme_errors.py)."""

    INTERNAL_ERROR = "internal_error"
    INVALID_JSON = "invalid_json"
    INVALID_TYPE = "invalid_type"
    INVALID_VALUE = "invalid_value"
    UNSUPPORTED_VALUE = "unsupported_value"
    REQUEST_TIMEOUT = "request_timeout"
    REQUEST_TOO_LARGE = "request_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    REQUEST_HEADERS_TOO_LARGE = "request_headers_too_large"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    GATEWAY_STOPPING = "gateway_stopping"
    INVALID_API_KEY = "invalid_api_key"
    PERMISSION_DENIED = "permission_denied"
    MODEL_NOT_ALLOWED = "model_not_allowed"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    ENDPOINT_NOT_SERVED = "endpoint_not_served"
    RESPONSE_NOT_FOUND = "response_not_found"
    BACKEND_NOT_FOUND = "backend_not_found"
    ZONE_NOT_FOUND = "zone_not_found"
    PROFILE_NOT_FOUND = "profile_not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    YIELD_NOT_MET = "yield_not_met"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_BAD_STATUS = "upstream_bad_status"
    BACKEND_STARTING = "backend_starting"
    BACKEND_STOPPED = "backend_stopped"
    BACKEND_FAILED = "backend_failed"
    BACKEND_BLOCKED = "backend_blocked"
    BACKEND_YIELDED = "backend_yielded"
    BACKEND_DISABLED = "backend_disabled"
    BACKEND_NO_VRAM = "backend_no_vram"
    BACKEND_PORT_IN_USE = "backend_port_in_use"
    BACKEND_QUEUE_FULL = "backend_queue_full"
    BACKEND_RUNTIME = "backend_runtime"
    BACKEND_WAKE_TIMEOUT = "backend_wake_timeout"
    ALL_ENTRIES_COOLING = "all_entries_cooling"
    FALLBACK_EXHAUSTED = "fallback_exhausted"
    FALLBACK_DEADLINE = "fallback_deadline"


class GatewayError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    default_code: ClassVar[ErrorCode | None] = ErrorCode.INTERNAL_ERROR

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        message = safe_text(message)
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.param = None if param is None else safe_text(param)
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """OpenAI's error envelope: `error` is always an object."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    default_code: ClassVar[ErrorCode | None] = None

    @classmethod
    def wrong_type(cls, param: str, wanted: str, value: object) -> InvalidRequest:
        """`param` holds a JSON value of the wrong type; worded as OpenAI words it."""
        got = json_type_name(value)
        return cls(
            f"Invalid type for '{quoted(param)}': expected {wanted}, but got {got}.",
            param=param,
            code=ErrorCode.INVALID_TYPE,
        )


class RequestTimeout(InvalidRequest):
    """The body did not arrive in time; the connection is closed after the answer (the
    rest of the body is never read)."""

    status = 408
    default_code = ErrorCode.REQUEST_TIMEOUT

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"connection": "close"})


class PayloadTooLarge(InvalidRequest):
    status = 413
    default_code = ErrorCode.REQUEST_TOO_LARGE


class UnsupportedMediaType(InvalidRequest):
    status = 415
    default_code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class RequestHeadersTooLarge(InvalidRequest):
    status = 431
    default_code = ErrorCode.REQUEST_HEADERS_TOO_LARGE


class AuthenticationFailed(GatewayError):
    status = 401
    type = "invalid_request_error"
    default_code = ErrorCode.INVALID_API_KEY

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"www-authenticate": "Bearer"})


class PermissionDenied(GatewayError):
    status = 403
    type = "invalid_request_error"
    default_code = ErrorCode.PERMISSION_DENIED


class ModelNotAllowed(PermissionDenied):
    """The client's key may not use the model (`models:` of its entry in keys.yaml)."""

    default_code = ErrorCode.MODEL_NOT_ALLOWED

    def __init__(self, model: str, key: str) -> None:
        super().__init__(
            f"The key '{quoted(key)}' may not use the model '{quoted(model)}'; GET /v1/models "
            "lists the models it may use.",
            param="model",
        )


class RateLimited(GatewayError):
    """A limit of the client's key (keys.yaml) refuses the request for now; `Retry-After`
    says when it fits again and the `x-ratelimit-*` headers say where the key stands."""

    status = 429
    type = "rate_limit_error"
    default_code = ErrorCode.RATE_LIMIT_EXCEEDED

    def __init__(self, message: str, *, headers: dict[str, str]) -> None:
        super().__init__(message, headers=headers)


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = ErrorCode.MODEL_NOT_FOUND

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model '{quoted(model)}' does not exist or is not served by this gateway; "
            "GET /v1/models lists the available ones.",
            param="model",
        )


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = ErrorCode.NOT_FOUND


class EndpointNotServed(NotFound):
    default_code = ErrorCode.ENDPOINT_NOT_SERVED


class ResponseNotFound(NotFound):
    default_code = ErrorCode.RESPONSE_NOT_FOUND

    def __init__(
        self, response_id: str, *, message: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(
            message
            or f"No response with id '{quoted(response_id)}' was created through this gateway "
            "recently (ids are remembered for a bounded time, and a backend forgets its responses "
            "when it stops).",
            param=param,
        )


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    default_code = ErrorCode.METHOD_NOT_ALLOWED


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    default_code = ErrorCode.CONFLICT


class YieldNotMet(Conflict):
    """A yield that could not free its `min_free_mib`: the gateway has undone it."""

    default_code = ErrorCode.YIELD_NOT_MET


class TooManyConnections(GatewayError):
    """Every one of the gateway's `max_connections` has a request in flight."""

    status = 503
    default_code = ErrorCode.TOO_MANY_CONNECTIONS

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"retry-after": "1"})


class GatewayStopping(GatewayError):
    """The gateway is shutting down: a request still open when its grace is nearly over
    (in a stream, in-band), or one arriving after that."""

    status = 503
    default_code = ErrorCode.GATEWAY_STOPPING

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"retry-after": "1", "connection": "close"})


class UpstreamError(GatewayError):
    """The upstream could not give an answer; `kind` is a bounded metric label."""

    type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, code=code, headers=headers)
        self.kind = kind


class UpstreamUnavailable(UpstreamError):
    status = 503
    default_code = ErrorCode.UPSTREAM_UNAVAILABLE


class UpstreamBadStatus(UpstreamError):
    """The upstream answered with a status no HTTP response can carry (e.g. 999): relayed,
    it would break the client's connection."""

    status = 502
    default_code = ErrorCode.UPSTREAM_BAD_STATUS


class UpstreamTimeout(UpstreamError):
    status = 504
    default_code = ErrorCode.UPSTREAM_TIMEOUT


class UnavailableKind(StrEnum):
    """Why a local backend cannot take a request; its error code is `backend_<kind>`."""

    STARTING = "starting"
    STOPPED = "stopped"
    FAILED = "failed"
    BLOCKED = "blocked"  # a VRAM zone holds its memory
    YIELDED = "yielded"  # a VRAM yield took it
    DISABLED = "disabled"  # the active GPU profile disables it
    NO_VRAM = "no_vram"  # admission refused the start
    PORT_IN_USE = "port_in_use"  # its start failed: another server answers on its port
    QUEUE_FULL = "queue_full"  # `max_waiting` requests are held already
    RUNTIME = "runtime"  # the runtime could not do it (e.g. Docker proxy down)


# How the reason of a start refused because another server answers on the backend's port
# begins (`app.runtimes.port_check`, `app.lifecycle.server.NotOurServer`): its requests
# are refused with `backend_port_in_use` (`app.lifecycle.state.failure_kind`).
PORT_IN_USE_REASON: Final = f"{UnavailableKind.PORT_IN_USE}: "


class BackendUnavailable(UpstreamUnavailable):
    """A local backend cannot take the request now; `kind` says why."""

    def __init__(
        self, message: str, *, kind: UnavailableKind, retry_after_s: int | None = None
    ) -> None:
        headers = {"retry-after": str(retry_after_s)} if retry_after_s is not None else None
        super().__init__(message, kind=kind, code=f"backend_{kind}", headers=headers)


class WakeTimeout(UpstreamTimeout):
    """A request held for a starting backend waited its `max_wait_s`."""

    def __init__(self, message: str, *, retry_after_s: int = 10) -> None:
        super().__init__(
            message,
            kind="wake_timeout",
            code=ErrorCode.BACKEND_WAKE_TIMEOUT,
            headers={"retry-after": str(retry_after_s)},
        )


class _ChainError(GatewayError):
    """What a fallback chain passed over, as `error.tried` in the envelope (a mixin before
    the error's own class: `class FallbackDeadline(_ChainError, UpstreamTimeout)`)."""

    tried: list[tuple[str, str]]

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["error"]["tried"] = [{"entry": entry, "reason": why} for entry, why in self.tried]
        return body


class _NoEntryLeft(_ChainError, UpstreamUnavailable):
    """A chain with no entry left to try; `Retry-After` says when one may be tried again
    (none: no entry will)."""

    chain_kind: str  # the `kind` (a metric label) of each subclass

    def __init__(
        self, message: str, *, tried: list[tuple[str, str]], retry_after_s: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        extra = {"retry-after": str(retry_after_s)} if retry_after_s is not None else {}
        super().__init__(message, kind=self.chain_kind, headers={**(headers or {}), **extra})
        self.tried = tried


class AllEntriesCooling(_NoEntryLeft):
    """Every entry of a fallback chain is skipped (open circuits, no key); `Retry-After`
    says when the first may be tried again."""

    default_code = ErrorCode.ALL_ENTRIES_COOLING
    chain_kind = "all_cooling"


class FallbackExhausted(_NoEntryLeft):
    """Every entry of a fallback chain was tried (or skipped) and none could answer."""

    default_code = ErrorCode.FALLBACK_EXHAUSTED
    chain_kind = "exhausted"


class FallbackDeadline(_ChainError, UpstreamTimeout):
    """The chain's `deadline_s` passed before any entry answered."""

    default_code = ErrorCode.FALLBACK_DEADLINE

    def __init__(
        self, message: str, *, tried: list[tuple[str, str]], headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message, kind="deadline", headers=headers)
        self.tried = tried


_JSON_NAMES: Final = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}


def json_type_name(value: object) -> str:
    """The JSON name of a parsed value's type (`integer`, `array`, `null`, ...)."""
    return _JSON_NAMES.get(type(value), type(value).__name__)


MAX_QUOTED: Final = 200


def safe_text(text: str) -> str:
    """`text` with what UTF-8 cannot encode (lone surrogates, which a JSON body may hold as
    `\\udcff` escapes) written as backslash escapes; anything else unchanged. Every error
    message goes through it, so rendering one can never fail on what a client sent."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def quoted(text: str, limit: int = MAX_QUOTED) -> str:
    """Client-supplied text as an error message quotes it: encodable, and cut at `limit`
    characters (a 10 MB model name is not echoed back)."""
    text = safe_text(text)
    return text if len(text) <= limit else text[:limit] + "..."
