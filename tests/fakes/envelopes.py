"""What every answer of the gateway must look like, whatever it was sent (the fuzzers'
invariants): no 5xx of its own making, no traceback, every error in its route's envelope."""

from __future__ import annotations

import json
from typing import Any

import httpx

from app.errors import ErrorCode

_TRACEBACK_MARKS = ("Traceback (most recent call last)", 'File "/', "site-packages")
_GATEWAY_CODES = frozenset(ErrorCode)
# The codes the gateway writes when the backend itself failed (it is up and answering here,
# so any of these means the gateway lost it) are still its own; none is accepted.


def _is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


# aiohttp's answer when a handler of the fake vLLM raises (it does on a multipart body
# that does not end, or a text field that is not UTF-8: not the gateway's to judge).
FAKE_CRASH = "500 Internal Server Error\n\nServer got itself in trouble"


def _from_backend(body: Any) -> bool:
    """A body the fake vLLM wrote and the gateway relayed: vLLM's envelope carries the
    status as an integer `code`; its router's 404 is `{"detail": "Not Found"}`."""
    if body == {"detail": "Not Found"}:
        return True
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and isinstance(error.get("code"), int)


def problems(path: str, response: httpx.Response) -> list[str]:
    """What is wrong with `response` to a request for `path` (empty when all is well)."""
    found: list[str] = []
    text = response.content.decode("utf-8", "replace")
    for mark in _TRACEBACK_MARKS:
        if mark in text:
            found.append(f"traceback text in the body ({mark!r})")
    status = response.status_code
    if status < 400:
        return found
    if text == FAKE_CRASH:
        return found
    try:
        body = json.loads(response.content)
    except ValueError:
        return [*found, f"{status} with a body that is not JSON: {text[:200]!r}"]
    if _is_anthropic(path):
        ok = (
            isinstance(body, dict)
            and body.get("type") == "error"
            and isinstance(body.get("error"), dict)
            and isinstance(body["error"].get("type"), str)
            and isinstance(body["error"].get("message"), str)
        )
        if not ok:
            found.append(f"{status} not in Anthropic's envelope: {text[:300]}")
        elif status >= 500 and body["error"]["type"] == "api_error":
            found.append(f"{status} from the gateway itself: {text[:300]}")
        return found
    if _from_backend(body):
        return found
    error: Any = body.get("error") if isinstance(body, dict) else None
    ok = (
        isinstance(error, dict)
        and {"message", "type", "param", "code"} <= error.keys()
        and isinstance(error["message"], str)
        and isinstance(error["type"], str)
        and (error["param"] is None or isinstance(error["param"], str))
        and (error["code"] is None or isinstance(error["code"], str))
    )
    if not ok:
        found.append(f"{status} not in OpenAI's envelope: {text[:300]}")
    elif status >= 500:
        found.append(f"{status} from the gateway itself: {text[:300]}")
    elif not (
        error["code"] is None
        or error["code"] in _GATEWAY_CODES
        or error["code"].startswith("http_")
    ):
        found.append(f"{status} with a code the gateway does not know: {error['code']!r}")
    return found
