"""The one error hierarchy of the gateway.

Every failure a client can see is a `GatewayError`; each class knows its HTTP status
and the OpenAI error `type`/`code` it renders as. Rendering happens only in
`app.api.handlers`; transport exceptions never escape `app.upstreams`/`app.runtimes`.

    GatewayError (500, server_error)
    ├── InvalidRequest (400, invalid_request_error)
    │   └── PayloadTooLarge (413)
    ├── AuthenticationFailed (401, code invalid_api_key)
    ├── PermissionDenied (403)
    ├── ModelNotFound (404, code model_not_found)
    ├── NotFound (404, code not_found)            unknown path
    ├── MethodNotAllowed (405)
    ├── UpstreamError (server_error)              the upstream could not answer
    │   ├── UpstreamUnavailable (503)             refused, reset, backend not ready
    │   └── UpstreamTimeout (504)                 connect, first byte or idle timeout
    └── ...later issues add lifecycle and fallback errors here
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.param = param
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
    default_code: ClassVar[str | None] = None


class PayloadTooLarge(InvalidRequest):
    status = 413
    default_code = "request_too_large"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "invalid_request_error"
    default_code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"www-authenticate": "Bearer"})


class PermissionDenied(GatewayError):
    status = 403
    type = "invalid_request_error"
    default_code = "permission_denied"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model '{model}' does not exist or is not served by this gateway; "
            "GET /v1/models lists the available ones.",
            param="model",
        )


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    default_code = "method_not_allowed"


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
    default_code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    default_code = "upstream_timeout"
