"""The fallback policy: verdicts for every status and local reason, Retry-After, budgets."""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from email.utils import formatdate
from typing import cast

import pytest

from app.errors import (
    BackendUnavailable,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    PayloadTooLarge,
    UnavailableKind,
    UpstreamTimeout,
    UpstreamUnavailable,
    WakeTimeout,
)
from app.routing.policy import (
    DEFAULT_FALLBACK_ON_STATUS,
    REASONS,
    Budget,
    PolicyConfig,
    Verdict,
    classify,
    classify_error,
    classify_response,
    first_byte_timeout,
    parse_retry_after,
)
from app.routing.policy import FallbackReason as R

NOW = 1_700_000_000.0  # wall clock, whole seconds so HTTP-dates are exact
DEFAULT = PolicyConfig()
NEXT_ON_CONTEXT = PolicyConfig(on_context_length="next")


def openai_error(
    message: str, code: str | None = None, type_: str = "invalid_request_error"
) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": code}}
    ).encode()


def anthropic_error(type_: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": type_, "message": message}}).encode()


def verdict(
    status: int, body: bytes = b"", config: PolicyConfig = DEFAULT, **headers: str
) -> Verdict:
    pairs = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return classify_response(status, pairs, body, config, now=NOW)


SERVE = Verdict("serve", R.OK, upstream_ok=True)
RELAY = Verdict("relay", R.CLIENT_ERROR, upstream_ok=True)
AUTH = Verdict("next", R.AUTH_MISCONFIGURED, cooldown_s=300.0, counts_as_failure=True)


# -- HTTP statuses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b'{"id":"chatcmpl-1"}', SERVE),
        (201, b"", SERVE),
        (204, b"", SERVE),
        (401, openai_error("Incorrect API key provided", "invalid_api_key"), AUTH),
        (403, anthropic_error("permission_error", "no access to this model"), AUTH),
        (
            402,
            openai_error("Insufficient Balance"),
            Verdict("next", R.QUOTA_EXHAUSTED, 300.0, True),
        ),
        (
            429,
            openai_error("You exceeded your current quota", "insufficient_quota"),
            Verdict("next", R.QUOTA_EXHAUSTED, 300.0, True),
        ),
        (
            429,
            openai_error("Rate limit reached", "rate_limit_exceeded"),
            Verdict("next", R.RATE_LIMITED, None, True),
        ),
        (500, b"Internal Server Error", Verdict("next", R.HTTP_5XX, None, True)),
        (501, b"", Verdict("next", R.HTTP_5XX, None, True)),
        (502, b"<html>Bad Gateway</html>", Verdict("next", R.HTTP_5XX, None, True)),
        (504, b"", Verdict("next", R.HTTP_5XX, None, True)),
        (599, b"", Verdict("next", R.HTTP_5XX, None, True)),
        (503, b"", Verdict("next", R.UNAVAILABLE, None, True)),
        (
            529,
            anthropic_error("overloaded_error", "Overloaded"),
            Verdict("next", R.OVERLOADED, None, True),
        ),
        (
            500,
            anthropic_error("overloaded_error", "Overloaded"),
            Verdict("next", R.OVERLOADED, None, True),
        ),
        (400, openai_error("'messages' is a required property"), RELAY),
        (404, openai_error("The model `x` does not exist", "model_not_found"), RELAY),
        (413, b"request entity too large", RELAY),
        (422, b'{"detail":[{"msg":"field required"}]}', RELAY),
        (405, b"", RELAY),
        (408, b"", RELAY),
        (409, b"", RELAY),
        (302, b"", Verdict("next", R.UNEXPECTED_STATUS, None, True)),
        (304, b"", Verdict("next", R.UNEXPECTED_STATUS, None, True)),
    ],
)
def test_status_rules(status: int, body: bytes, expected: Verdict) -> None:
    assert verdict(status, body) == expected
    assert expected.reason in REASONS


@pytest.mark.parametrize(
    "body",
    [
        openai_error(
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130000 tokens. Please reduce the length of the messages.",
            "context_length_exceeded",
        ),
        # The code alone is enough.
        openai_error("Input too long.", "context_length_exceeded"),
        # vLLM (old envelope, then the nested one): no code, a message.
        b'{"object":"error","message":"This model\'s maximum context length is 4096 tokens. '
        b'However, you requested 5000 tokens (4000 in the messages, 1000 in the completion).",'
        b'"type":"BadRequestError","param":null,"code":400}',
        openai_error(
            "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's Maximum "
            "Context Length is 4096 tokens and your request has 3500 input tokens",
            type_="BadRequestError",
        ),
        openai_error(
            "The decoder prompt (length 5000) is longer than the maximum model length of 4096.",
            type_="BadRequestError",
        ),
        # Anthropic.
        anthropic_error(
            "invalid_request_error", "prompt is too long: 208000 tokens > 200000 maximum"
        ),
        anthropic_error(
            "invalid_request_error",
            "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000",
        ),
        # A body cut short in the first chunk still counts.
        b'{"error":{"message":"This model\'s maximum context length is 4096 tok',
    ],
)
@pytest.mark.parametrize("status", [400, 413])
def test_context_length_errors_follow_the_chain_setting(status: int, body: bytes) -> None:
    assert verdict(status, body) == Verdict("relay", R.CONTEXT_LENGTH, upstream_ok=True)
    assert verdict(status, body, NEXT_ON_CONTEXT) == Verdict(
        "next", R.CONTEXT_LENGTH, upstream_ok=True
    )


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (422, openai_error("maximum context length is 4096 tokens")),  # only 400 and 413
        (404, openai_error("prompt is too long")),
        (400, openai_error("temperature must be at most 2", "invalid_value")),
        (400, b""),
    ],
)
def test_other_client_errors_are_relayed_even_when_context_length_falls_back(
    status: int, body: bytes
) -> None:
    assert verdict(status, body, NEXT_ON_CONTEXT) == RELAY


def test_compressed_error_bodies_are_read() -> None:
    body = anthropic_error("invalid_request_error", "prompt is too long: 300000 tokens")
    raw_deflate = zlib.compressobj(wbits=-15)
    raw = raw_deflate.compress(body) + raw_deflate.flush()
    expected = Verdict("next", R.CONTEXT_LENGTH, upstream_ok=True)
    assert verdict(400, gzip.compress(body), NEXT_ON_CONTEXT, content_encoding="gzip") == expected
    assert (
        verdict(400, zlib.compress(body), NEXT_ON_CONTEXT, content_encoding="deflate") == expected
    )
    assert verdict(400, raw, NEXT_ON_CONTEXT, content_encoding="deflate") == expected
    # A gzip stream cut short (the first chunk only) yields what it holds.
    filler = " ".join(str(i * 7919 % 10007) for i in range(2000))
    long_body = anthropic_error("invalid_request_error", "prompt is too long: " + filler)
    cut = gzip.compress(long_body)[:200]
    assert verdict(400, cut, NEXT_ON_CONTEXT, content_encoding="gzip") == expected


def test_unreadable_bodies_are_not_context_length_errors() -> None:
    body = openai_error("maximum context length", "context_length_exceeded")
    assert verdict(400, body, NEXT_ON_CONTEXT, content_encoding="br") == RELAY
    assert verdict(400, b"\x1f\x8b garbage", NEXT_ON_CONTEXT, content_encoding="gzip") == RELAY


def test_fallback_on_status_decides_the_4xx() -> None:
    without_429 = PolicyConfig(fallback_on_status=frozenset({500, 502, 503, 504}))
    assert verdict(429, b"", without_429, retry_after="5") == Verdict(
        "relay", R.RATE_LIMITED, upstream_ok=True
    )
    with_408 = PolicyConfig(fallback_on_status=DEFAULT_FALLBACK_ON_STATUS | {408})
    assert verdict(408, b"", with_408) == Verdict("next", R.HTTP_4XX, None, True)
    # Every 5xx falls back, listed or not.
    only_429 = PolicyConfig(fallback_on_status=frozenset({429}))
    assert verdict(500, b"", only_429) == Verdict("next", R.HTTP_5XX, None, True)
    assert verdict(529, b"", only_429) == Verdict("next", R.OVERLOADED, None, True)
    # Quota and auth failures do not depend on the set.
    assert verdict(429, openai_error("quota", "insufficient_quota"), without_429) == Verdict(
        "next", R.QUOTA_EXHAUSTED, 300.0, True
    )
    assert verdict(401, b"", only_429) == AUTH


def test_auth_cooldown_is_configurable() -> None:
    config = PolicyConfig(auth_cooldown_s=60.0)
    assert verdict(401, b"", config) == Verdict("next", R.AUTH_MISCONFIGURED, 60.0, True)
    assert verdict(402, b"", config) == Verdict("next", R.QUOTA_EXHAUSTED, 60.0, True)


# -- Retry-After ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "reason"), [(429, "rate_limited"), (503, "unavailable"), (529, "overloaded")]
)
@pytest.mark.parametrize(
    ("headers", "cooldown"),
    [
        ({"retry_after": "7"}, 7.0),
        ({"retry_after": " 12 "}, 12.0),
        ({"retry_after": "1.5"}, 1.5),
        ({"retry_after": formatdate(NOW + 30, usegmt=True)}, 30.0),  # IMF-fixdate
        ({"retry_after": "Tue, 14 Nov 2023 22:13:40 GMT"}, 20.0),  # NOW + 20
        ({"retry_after": "Tuesday, 14-Nov-23 22:13:40 GMT"}, 20.0),  # RFC 850
        ({"retry_after": "Tue Nov 14 22:13:40 2023"}, 20.0),  # asctime, no zone: GMT
        ({"retry_after": "99999"}, 3600.0),  # capped at max_cooldown_s
        ({"retry_after_ms": "2500"}, 2.5),
        ({"retry_after_ms": "2500", "retry_after": "9"}, 2.5),  # the precise one wins
        ({"retry_after_ms": "soon", "retry_after": "9"}, 9.0),  # ... when valid
        ({"retry_after_ms": "0", "retry_after": "9"}, 9.0),
        # Ignored: the failure only counts towards the circuit.
        ({}, None),
        ({"retry_after": "soon"}, None),
        ({"retry_after": ""}, None),
        ({"retry_after": "-5"}, None),
        ({"retry_after": "0"}, None),
        ({"retry_after": "1e3"}, None),
        ({"retry_after": "5 seconds"}, None),
        ({"retry_after": formatdate(NOW - 60, usegmt=True)}, None),  # in the past
        ({"retry_after": formatdate(NOW, usegmt=True)}, None),  # now
        ({"retry_after": "Tue, 14 Nov 2023 25:14:20 GMT"}, None),  # hour 25
    ],
)
def test_retry_after_sets_the_cooldown(
    status: int, reason: str, headers: dict[str, str], cooldown: float | None
) -> None:
    assert verdict(status, b"", DEFAULT, **headers) == Verdict("next", R(reason), cooldown, True)


def test_retry_after_is_found_in_any_header_shape_and_case() -> None:
    expected = Verdict("next", R.RATE_LIMITED, 7.0, True)
    assert classify_response(429, {"Retry-After": "7"}, b"", DEFAULT, now=NOW) == expected
    assert classify_response(429, [(b"retry-after", b"7")], b"", DEFAULT, now=NOW) == expected
    assert classify_response(429, [(b"Retry-After", b"7")], b"", DEFAULT, now=NOW) == expected


@pytest.mark.parametrize("status", [500, 502, 504])
def test_retry_after_is_ignored_on_other_5xx(status: int) -> None:
    assert verdict(status, b"", retry_after="10") == Verdict("next", R.HTTP_5XX, None, True)


def test_quota_cooldown_is_the_longer_of_the_default_and_retry_after() -> None:
    quota = openai_error("quota", "insufficient_quota")
    assert verdict(429, quota, retry_after="900") == Verdict("next", R.QUOTA_EXHAUSTED, 900.0, True)
    assert verdict(429, quota, retry_after="5") == Verdict("next", R.QUOTA_EXHAUSTED, 300.0, True)


def test_parse_retry_after() -> None:
    assert parse_retry_after("120", now=NOW) == 120.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 -0000", now=1445412470.0) == 10.0
    assert parse_retry_after(None, now=NOW) is None
    assert parse_retry_after("tomorrow", now=NOW) is None
    assert parse_retry_after("9" * 400, now=NOW) is None  # not a finite number


# -- raised errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (UpstreamUnavailable("refused", kind="connect"), Verdict("next", R.CONNECT, None, True)),
        (UpstreamTimeout("slow", kind="connect_timeout"), Verdict("next", R.CONNECT, None, True)),
        (
            UpstreamTimeout("stall", kind="first_byte_timeout"),
            Verdict("next", R.TIMEOUT, None, True),
        ),
        (UpstreamTimeout("stall", kind="idle_timeout"), Verdict("next", R.TIMEOUT, None, True)),
        (
            UpstreamUnavailable("cut", kind="disconnected"),
            Verdict("next", R.DISCONNECTED, None, True),
        ),
        (UpstreamUnavailable("?", kind="new_kind"), Verdict("next", R.UPSTREAM_ERROR, None, True)),
        (UpstreamTimeout("?", kind="new_kind"), Verdict("next", R.TIMEOUT, None, True)),
        (
            BackendUnavailable("b", kind=UnavailableKind.STARTING, retry_after_s=5),
            Verdict("next", R.LOCAL_STARTING),
        ),
        (BackendUnavailable("b", kind=UnavailableKind.STOPPED), Verdict("next", R.LOCAL_STOPPED)),
        (BackendUnavailable("b", kind=UnavailableKind.BLOCKED), Verdict("next", R.LOCAL_BLOCKED)),
        (BackendUnavailable("b", kind=UnavailableKind.YIELDED), Verdict("next", R.LOCAL_YIELDED)),
        (BackendUnavailable("b", kind=UnavailableKind.NO_VRAM), Verdict("next", R.LOCAL_NO_VRAM)),
        (
            BackendUnavailable("b", kind=UnavailableKind.QUEUE_FULL, retry_after_s=5),
            Verdict("next", R.LOCAL_QUEUE_FULL),
        ),
        (BackendUnavailable("b", kind=UnavailableKind.DISABLED), Verdict("next", R.LOCAL_DISABLED)),
        (
            BackendUnavailable("b", kind=UnavailableKind.FAILED, retry_after_s=8),
            Verdict("next", R.LOCAL_FAILED, None, True),
        ),
        (
            BackendUnavailable("b", kind=UnavailableKind.RUNTIME),
            Verdict("next", R.LOCAL_RUNTIME, None, True),
        ),
        (  # a kind this policy does not know yet
            BackendUnavailable("b", kind=cast(UnavailableKind, "new_kind")),
            Verdict("next", R.LOCAL_UNAVAILABLE),
        ),
        (WakeTimeout("still starting"), Verdict("next", R.LOCAL_WAKE_TIMEOUT, None, True)),
        (InvalidRequest("bad"), Verdict("relay", R.CLIENT_ERROR)),
        (PayloadTooLarge("big"), Verdict("relay", R.CLIENT_ERROR)),
        (ModelNotFound("x"), Verdict("relay", R.CLIENT_ERROR)),
        (GatewayError("bug"), Verdict("relay", R.INTERNAL)),
    ],
)
def test_error_rules(error: GatewayError, expected: Verdict) -> None:
    assert classify_error(error) == expected
    assert classify(error, DEFAULT, now=NOW) == expected
    assert expected.reason in REASONS


@dataclass
class Head:
    status: int
    headers: list[tuple[bytes, bytes]]
    first_chunk: bytes


def test_classify_reads_an_opened_response() -> None:
    assert classify(Head(200, [], b"data: {}"), DEFAULT, now=NOW) == SERVE
    head = Head(429, [(b"retry-after", b"3")], b"")
    assert classify(head, DEFAULT, now=NOW) == Verdict("next", R.RATE_LIMITED, 3.0, True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on_context_length": "retry"}, "on_context_length"),
        ({"fallback_on_status": frozenset({200})}, "outside 400-599"),
        ({"auth_cooldown_s": 0.0}, "auth_cooldown_s"),
        ({"max_cooldown_s": -1.0}, "max_cooldown_s"),
    ],
)
def test_policy_config_is_validated(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**kwargs)  # type: ignore[arg-type]


def test_default_policy_config() -> None:
    assert DEFAULT.on_context_length == "relay"
    assert DEFAULT.fallback_on_status == frozenset({429, 500, 502, 503, 504, 529})
    assert DEFAULT.auth_cooldown_s == 300.0


# -- budget ---------------------------------------------------------------------------------


def test_budget_arithmetic() -> None:
    budget = Budget.start(100.0, 30.0, max_attempts=3)
    assert budget == Budget(deadline=130.0, max_attempts=3)
    assert budget.remaining(100.0) == 30.0
    assert budget.remaining(110.0) == 20.0
    assert budget.remaining(130.0) == 0.0
    assert budget.remaining(140.0) == 0.0


def test_budget_allows_attempts_until_the_deadline_or_the_cap() -> None:
    budget = Budget(deadline=130.0, max_attempts=3)
    assert budget.allows_attempt(100.0, 0)
    assert budget.allows_attempt(129.5, 2)
    assert not budget.allows_attempt(110.0, 3)
    assert not budget.allows_attempt(130.0, 0)
    assert not budget.allows_attempt(131.0, 1)


def test_first_byte_timeout_is_cut_to_the_budget() -> None:
    budget = Budget(deadline=130.0, max_attempts=3)
    assert first_byte_timeout(budget, 100.0, 10.0) == 10.0  # the entry's own
    assert first_byte_timeout(budget, 110.0, 60.0) == 20.0  # what is left
    assert first_byte_timeout(budget, 110.0, None) == 20.0  # the entry sets none
    assert first_byte_timeout(budget, 135.0, 60.0) == 0.0


def test_a_budget_needs_one_attempt() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        Budget(deadline=1.0, max_attempts=0)
