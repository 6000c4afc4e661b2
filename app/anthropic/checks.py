"""Validation helpers shared by the request translations (both directions). Pure.

Errors are `InvalidRequest` (400) naming the parameter, worded as OpenAI words them.
"""

from __future__ import annotations

from typing import Any

from app.errors import ErrorCode, InvalidRequest

Json = dict[str, Any]


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def number(value: object, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest.wrong_type(param, "a number", value)
    return float(value)


def required_str(obj: Json, key: str, param: str, *, allow_empty: bool = False) -> str:
    value = obj.get(key)
    if value is None:
        raise InvalidRequest(
            f"Missing required parameter: '{param}.{key}'.", param=f"{param}.{key}"
        )
    if not isinstance(value, str) or (not value and not allow_empty):
        raise InvalidRequest.wrong_type(f"{param}.{key}", "a non-empty string", value)
    return value


def invalid(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code=ErrorCode.INVALID_VALUE)


def unsupported(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code=ErrorCode.UNSUPPORTED_VALUE)
