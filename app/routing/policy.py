"""The fallback policy: what one attempt's outcome means for the chain. Pure: no I/O, no clock.

An attempt at a chain entry ends in a raised `GatewayError` (a local refusal or an upstream
transport failure) or an opened upstream response (status, headers, first bytes of the
body). `classify()` turns either into a `Verdict`:

- `action`: `serve` (2xx: relay it to the client), `relay` (a client error: relay it as
  is, never try elsewhere), `next` (try the next entry of the chain);
- `reason`: a `FallbackReason` from `REASONS` (metrics, the `x-microscheduler-fallbacks`
  header, the 503 body);
- `cooldown_s`: skip this entry that long (its circuit opens at once), or None;
- `counts_as_failure`: counts towards the entry's circuit threshold;
- `upstream_ok`: the entry answered as a working upstream does (a 2xx, or an HTTP client
  error it judged): closes a half-open circuit and resets the failure count. A verdict with
  neither flag nor a cooldown (a local refusal) leaves the circuit as it is.

Rules (issue 5, item 4). Upstream HTTP responses, first rule that matches (`upstream_ok`
is set on 2xx, on context-length errors and on every relayed status):

    status                         action  reason              cooldown_s                   fails
    2xx                            serve   ok                  -                            no
    401, 403                       next    auth_misconfigured  auth_cooldown_s              yes
    402; 429 with a quota code     next    quota_exhausted     max(auth_cooldown_s, R-A)    yes
    529; 5xx whose body says       next    overloaded          Retry-After                  yes
      overloaded_error
    503                            next    unavailable         Retry-After                  yes
    other 5xx                      next    http_5xx            -                            yes
    400, 413 context-length error  next    context_length      -                            no
                                           (on_context_length: next; else relay)
    429 in fallback_on_status      next    rate_limited        Retry-After                  yes
    429 not in it                  relay   rate_limited        -                            no
    other 4xx in it (e.g. 408)     next    http_4xx            -                            yes
    other 4xx (400, 404, 413, 422) relay   client_error        -                            no
    1xx, 3xx                       next    unexpected_status   -                            yes

- Every 5xx falls back whatever `fallback_on_status` says: a server error is never the
  caller's to fix. The set decides the 4xx: 429 by default; remove it to relay rate limits
  to the caller, add e.g. 408 to fall back on it.
- A context-length error is a 400 or 413 whose body carries OpenAI's
  `context_length_exceeded` code or a known message (vLLM "maximum context length" /
  "maximum model length", Anthropic "prompt is too long" / "exceed context limit"). The
  body is read from the first bytes only (gzip/deflate decoded, bounded); an unreadable body
  is not a context-length error, so it is relayed.
- `Retry-After` (and OpenAI's `retry-after-ms`, preferred when valid) is read for 429, 503
  and 529 (and the quota statuses): delay-seconds or an HTTP-date relative to `now`
  (wall-clock Unix time, the only use of `now`). Invalid, zero or past values are ignored:
  the failure then only counts towards the circuit. Values are capped at `max_cooldown_s`.
- 402 and quota 429s (`insufficient_quota`, `billing_hard_limit_reached`,
  `enforced_spend_limit_reached`) are a provider account problem like 401/403, not the
  caller's: they fall back and cool down for `auth_cooldown_s`.

Raised errors:

    error (kind)                              action  reason              fails
    UpstreamError connect, connect_timeout    next    connect             yes
    UpstreamError first_byte_timeout          next    timeout             yes
    UpstreamError idle_timeout                next    timeout             yes
    UpstreamError disconnected                next    disconnected        yes
    other UpstreamTimeout / UpstreamError     next    timeout / upstream_error  yes
    BackendUnavailable starting               next    local_starting      no
    BackendUnavailable stopped                next    local_stopped       no
    BackendUnavailable blocked (a zone)       next    local_blocked       no
    BackendUnavailable yielded (VRAM yield)   next    local_yielded       no
    BackendUnavailable no_vram                next    local_no_vram       no
    BackendUnavailable queue_full             next*   local_queue_full    no
    BackendUnavailable disabled               next    local_disabled      no
    BackendUnavailable failed                 next    local_failed        yes
    BackendUnavailable port_in_use            next    local_failed        yes
    BackendUnavailable runtime                next    local_runtime       yes
    BackendUnavailable, any other kind        next    local_unavailable   no
    WakeTimeout                               next    local_wake_timeout  yes
    (expected wake > the caller's max_wait_s) next    cold_start_budget   no
    other GatewayError, status < 500          relay   client_error        no
    other GatewayError, status >= 500         relay   internal            no

No raised error sets `cooldown_s` or `upstream_ok`.

(*) An opt-in trigger (`OPT_IN_TRIGGERS`): the walk moves on only when the chain's or the
client key's `fallback_on` lists it (`PolicyConfig.moves_on`); otherwise the refusal
itself (503 `backend_queue_full`, `Retry-After`) is the answer. A backend that is busy
(`max_waiting` requests held, or no slot within the wait) is healthy, and a burst at a
waking model must not become a burst of paid provider requests.

`stream_error` is the chain's own verdict on a 200 stream whose first event is an error
(`data: {"error": ...}`, or an Anthropic `error` event before any content): nothing has
reached the client yet, so it falls back and counts as a failure.

Local refusals never set `cooldown_s` (not even from their own Retry-After): the backend's
state answers for free and changes by itself, and a cooldown would skip it after it became
ready. Deliberate refusals of a healthy system (starting, stopped, blocked by a zone,
yielded, no VRAM, queue full, disabled) do not count as failures either; a crashed
backend, a broken runtime and a wake that took the backend's own `max_wait_s` do (a chain
that cut the wait short with its `wake_timeout_s` treats that as neutral instead).

Streaming rule (issue 5, item 5): the policy is consulted only before the first content
byte reaches the client; the caller enforces it. After that byte an upstream failure ends
the stream with the in-band error event and `[DONE]`, and no other entry is tried.

`Budget` bounds the whole request across the chain: one deadline and a cap on attempts.
`first_byte_timeout()` gives an attempt the smaller of its entry's first-byte timeout and
what remains of the budget. A timeout that fired because the budget ran out
(`remaining(now) == 0` then) is the budget's, not the entry's: release the circuit permit
instead of recording a failure.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Final, Literal, Protocol

from app.errors import (
    BackendUnavailable,
    GatewayError,
    UpstreamError,
    UpstreamTimeout,
    WakeTimeout,
)

Action = Literal["serve", "relay", "next"]


class FallbackReason(StrEnum):
    """Why a chain entry was passed over, or what an attempt at it came to: metric labels,
    the `x-microscheduler-fallbacks` header, `error.tried`, events. A closed vocabulary."""

    # Verdicts on an upstream response.
    OK = "ok"
    AUTH_MISCONFIGURED = "auth_misconfigured"
    QUOTA_EXHAUSTED = "quota_exhausted"
    OVERLOADED = "overloaded"
    UNAVAILABLE = "unavailable"
    HTTP_5XX = "http_5xx"
    CONTEXT_LENGTH = "context_length"
    RATE_LIMITED = "rate_limited"
    HTTP_4XX = "http_4xx"
    CLIENT_ERROR = "client_error"
    UNEXPECTED_STATUS = "unexpected_status"
    STREAM_ERROR = "stream_error"  # a 200 stream whose first event is an error
    # Verdicts on a raised error: transport failures, local refusals, the rest.
    CONNECT = "connect"
    TIMEOUT = "timeout"
    DISCONNECTED = "disconnected"
    UPSTREAM_ERROR = "upstream_error"
    LOCAL_STARTING = "local_starting"
    LOCAL_STOPPED = "local_stopped"
    LOCAL_BLOCKED = "local_blocked"
    LOCAL_YIELDED = "local_yielded"
    LOCAL_NO_VRAM = "local_no_vram"
    LOCAL_QUEUE_FULL = "local_queue_full"
    LOCAL_DISABLED = "local_disabled"
    LOCAL_FAILED = "local_failed"
    LOCAL_RUNTIME = "local_runtime"
    LOCAL_UNAVAILABLE = "local_unavailable"
    LOCAL_WAKE_TIMEOUT = "local_wake_timeout"
    # Cold (stopped, asleep, starting) and its learned start or wake takes longer than the
    # caller waits (`max_wait_s`): passed over at once while it warms (`app.routing.patience`).
    COLD_START_BUDGET = "cold_start_budget"
    INTERNAL = "internal"
    # Passed over without a verdict of the entry's own.
    NO_API_KEY = "no_api_key"  # its key variable was unset at start-up
    UNSUPPORTED_ENDPOINT = "unsupported_endpoint"  # e.g. Anthropic for /v1/embeddings
    KEY_NO_CLOUD = "key_no_cloud"  # a provider, and the client's key has `cloud: false`
    KEY_CLOUD_BUDGET = "key_cloud_budget"  # a provider; the key's daily_cloud_tokens are spent
    # A provider; today's spend of the key's daily_cloud_tokens could not be read (fail closed).
    KEY_CLOUD_BUDGET_UNKNOWN = "key_cloud_budget_unreadable"
    CIRCUIT_OPEN = "circuit_open"  # its circuit is open (it failed recently)
    TRIAL_IN_FLIGHT = "trial_in_flight"  # half-open: another request is its trial
    MAX_ATTEMPTS = "max_attempts"  # the chain's cap on upstream requests was reached
    DEADLINE = "deadline"  # the chain's deadline cut this attempt short
    DEADLINE_UNREACHED = "deadline_unreached"  # the deadline passed before it was reached


R = FallbackReason
# Reasons that are not a verdict on an attempt at the entry.
SKIP_REASONS: Final = (
    R.CIRCUIT_OPEN,
    R.TRIAL_IN_FLIGHT,
    R.NO_API_KEY,
    R.UNSUPPORTED_ENDPOINT,
    R.KEY_NO_CLOUD,
    R.KEY_CLOUD_BUDGET,
    R.KEY_CLOUD_BUDGET_UNKNOWN,
    R.MAX_ATTEMPTS,
    R.DEADLINE,
    R.COLD_START_BUDGET,
)

# Header shapes accepted: a mapping (httpx, aiohttp, plain dict) or the relayable pairs
# of `UpstreamResponse.headers`.
Headers = Mapping[str, str] | Sequence[tuple[bytes, bytes]]

DEFAULT_FALLBACK_ON_STATUS = frozenset({429, 500, 502, 503, 504, 529})

# How much of an error body is looked at (after decompression).
_SCAN_BYTES = 64 * 1024

_CONTEXT_MARKERS = (
    "context_length_exceeded",  # OpenAI, DeepSeek: error.code
    "maximum context length",  # OpenAI, DeepSeek, vLLM: "This model's maximum context length is"
    "maximum model length",  # vLLM: "... is longer than the maximum model length of"
    "prompt is too long",  # Anthropic: "prompt is too long: 208000 tokens > 200000 maximum"
    "exceed context limit",  # Anthropic: "input length and `max_tokens` exceed context limit"
    "context window",
)
_QUOTA_MARKERS = (
    "insufficient_quota",  # OpenAI 429: "You exceeded your current quota"
    "billing_hard_limit_reached",
    "enforced_spend_limit_reached",  # Anthropic 429
)
_OVERLOADED_MARKER = "overloaded_error"  # Anthropic's error.type (529, sometimes 500)
# delay-seconds (RFC 9110 10.2.3), and decimals as the OpenAI SDK accepts them.
_DELAY = re.compile(r"[0-9]+(?:\.[0-9]+)?")

_TRANSPORT_REASONS = {
    "connect": R.CONNECT,
    "connect_timeout": R.CONNECT,
    "first_byte_timeout": R.TIMEOUT,
    "idle_timeout": R.TIMEOUT,
    "disconnected": R.DISCONNECTED,
}
# kind -> (reason, counts_as_failure)
_LOCAL_REASONS = {
    "starting": (R.LOCAL_STARTING, False),
    "stopped": (R.LOCAL_STOPPED, False),
    "blocked": (R.LOCAL_BLOCKED, False),
    "yielded": (R.LOCAL_YIELDED, False),
    "no_vram": (R.LOCAL_NO_VRAM, False),
    "queue_full": (R.LOCAL_QUEUE_FULL, False),
    "disabled": (R.LOCAL_DISABLED, False),
    "failed": (R.LOCAL_FAILED, True),
    "port_in_use": (R.LOCAL_FAILED, True),  # a failed start, named for what to fix
    "runtime": (R.LOCAL_RUNTIME, True),
}

REASONS: Final = frozenset(FallbackReason) - {R.DEADLINE_UNREACHED, *SKIP_REASONS}


# Reasons that move a chain on only when opted in, by the trigger name `fallback_on`
# (the chain's or the client key's) lists: a busy local backend is a reason to wait (its
# own 503 with Retry-After reaches the client), not to spill to a paid provider.
OPT_IN_TRIGGERS: Final = {R.LOCAL_QUEUE_FULL: "queue_full"}


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Per-chain fallback options."""

    on_context_length: Literal["relay", "next"] = "relay"
    fallback_on_status: frozenset[int] = field(default=DEFAULT_FALLBACK_ON_STATUS)
    auth_cooldown_s: float = 300.0  # 401/403/402/quota: the entry is misconfigured
    max_cooldown_s: float = 3600.0  # cap on a cooldown taken from Retry-After
    fallback_on: frozenset[str] = frozenset()  # opt-in triggers (`OPT_IN_TRIGGERS`)

    def moves_on(self, reason: FallbackReason, key_triggers: frozenset[str] = frozenset()) -> bool:
        """Whether the walk goes on after a `next` verdict for `reason`: always, unless
        `reason` is an opt-in trigger that neither the chain nor the client's key lists
        (then the entry's own refusal is the answer)."""
        trigger = OPT_IN_TRIGGERS.get(reason)
        return trigger is None or trigger in self.fallback_on or trigger in key_triggers

    def __post_init__(self) -> None:
        if self.on_context_length not in ("relay", "next"):
            raise ValueError(
                f"on_context_length must be 'relay' or 'next', not {self.on_context_length!r}"
            )
        bad = sorted(s for s in self.fallback_on_status if not 400 <= s <= 599)
        if bad:
            raise ValueError(f"fallback_on_status holds statuses outside 400-599: {bad}")
        if not self.auth_cooldown_s > 0:
            raise ValueError("auth_cooldown_s must be positive")
        if not self.max_cooldown_s > 0:
            raise ValueError("max_cooldown_s must be positive")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one attempt's outcome means: for the chain (`action`) and the circuit."""

    action: Action
    reason: FallbackReason
    cooldown_s: float | None = None
    counts_as_failure: bool = False
    upstream_ok: bool = False


class ResponseHead(Protocol):
    """What `classify` reads of an opened response (`UpstreamResponse` fits)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Sequence[tuple[bytes, bytes]]: ...

    @property
    def first_chunk(self) -> bytes: ...


def classify(outcome: GatewayError | ResponseHead, config: PolicyConfig, *, now: float) -> Verdict:
    """The verdict on one attempt: a raised error, or an opened response's head.

    `now` is wall-clock Unix time, used only to read an HTTP-date `Retry-After`.
    """
    if isinstance(outcome, GatewayError):
        return classify_error(outcome)
    return classify_response(outcome.status, outcome.headers, outcome.first_chunk, config, now=now)


def classify_error(error: GatewayError) -> Verdict:
    """The verdict on an attempt that raised instead of giving a response."""
    if isinstance(error, WakeTimeout):
        return Verdict("next", R.LOCAL_WAKE_TIMEOUT, counts_as_failure=True)
    if isinstance(error, BackendUnavailable):
        reason, counts = _LOCAL_REASONS.get(error.kind, (R.LOCAL_UNAVAILABLE, False))
        return Verdict("next", reason, counts_as_failure=counts)
    if isinstance(error, UpstreamError):
        default = R.TIMEOUT if isinstance(error, UpstreamTimeout) else R.UPSTREAM_ERROR
        return Verdict("next", _TRANSPORT_REASONS.get(error.kind, default), counts_as_failure=True)
    return Verdict("relay", R.CLIENT_ERROR if error.status < 500 else R.INTERNAL)


def classify_response(
    status: int, headers: Headers, body: bytes, config: PolicyConfig, *, now: float
) -> Verdict:
    """The verdict on an upstream response from its status, headers and first body bytes."""
    if 200 <= status < 300:
        return Verdict("serve", R.OK, upstream_ok=True)
    if status in (401, 403):
        return Verdict(
            "next", R.AUTH_MISCONFIGURED, cooldown_s=config.auth_cooldown_s, counts_as_failure=True
        )
    if status == 402 or (status == 429 and _mentions(headers, body, _QUOTA_MARKERS)):
        wait = max(config.auth_cooldown_s, _cooldown(headers, config, now) or 0.0)
        return Verdict("next", R.QUOTA_EXHAUSTED, cooldown_s=wait, counts_as_failure=True)
    if 500 <= status <= 599:
        if status == 529 or _mentions(headers, body, (_OVERLOADED_MARKER,)):
            return _told_to_wait(R.OVERLOADED, headers, config, now)
        if status == 503:
            return _told_to_wait(R.UNAVAILABLE, headers, config, now)
        return Verdict("next", R.HTTP_5XX, counts_as_failure=True)
    if status in (400, 413) and _mentions(headers, body, _CONTEXT_MARKERS):
        return Verdict(config.on_context_length, R.CONTEXT_LENGTH, upstream_ok=True)
    if status == 429:
        if status in config.fallback_on_status:
            return _told_to_wait(R.RATE_LIMITED, headers, config, now)
        return Verdict("relay", R.RATE_LIMITED, upstream_ok=True)
    if 400 <= status <= 499:
        if status in config.fallback_on_status:
            return Verdict("next", R.HTTP_4XX, counts_as_failure=True)
        return Verdict("relay", R.CLIENT_ERROR, upstream_ok=True)
    return Verdict("next", R.UNEXPECTED_STATUS, counts_as_failure=True)


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a `Retry-After` value: delay-seconds or an HTTP-date.

    `now` is wall-clock Unix time. Returns None for a missing, invalid, zero or past value.
    Decimal seconds ("1.5") are accepted, as the OpenAI SDK does.
    """
    if value is None:
        return None
    text = value.strip()
    if _DELAY.fullmatch(text):
        seconds = float(text)
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # asctime and "-0000" forms: HTTP-dates are always GMT
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    return seconds


def _told_to_wait(
    reason: FallbackReason, headers: Headers, config: PolicyConfig, now: float
) -> Verdict:
    """An upstream that is busy or away: the next entry, a failure for the circuit, and
    the entry cooled down as long as the upstream's `Retry-After` asked (if it did)."""
    return Verdict(
        "next", reason, cooldown_s=_cooldown(headers, config, now), counts_as_failure=True
    )


def _cooldown(headers: Headers, config: PolicyConfig, now: float) -> float | None:
    """The cooldown the upstream asked for, capped; `retry-after-ms` wins when valid."""
    ms = _header(headers, "retry-after-ms")
    seconds = None
    if ms is not None and _DELAY.fullmatch(ms.strip()):
        value = float(ms.strip()) / 1000.0
        seconds = value if math.isfinite(value) and value > 0 else None
    if seconds is None:
        seconds = parse_retry_after(_header(headers, "retry-after"), now=now)
    if seconds is None:
        return None
    return min(seconds, config.max_cooldown_s)


def _header(headers: Headers, name: str) -> str | None:
    if isinstance(headers, Mapping):
        for key, value in headers.items():
            if key.lower() == name:
                return value
        return None
    raw = name.encode("latin-1")
    for raw_key, raw_value in headers:
        if raw_key.lower() == raw:
            return raw_value.decode("latin-1")
    return None


def _mentions(headers: Headers, body: bytes, markers: tuple[str, ...]) -> bool:
    text = _body_text(headers, body)
    return any(marker in text for marker in markers)


def _body_text(headers: Headers, body: bytes) -> str:
    """The first bytes of a body as lower-case text; gzip/deflate decoded, bounded."""
    encoding = (_header(headers, "content-encoding") or "identity").strip().lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        data = b""
        # 47: zlib or gzip header, detected; -15: the raw deflate some servers send.
        for wbits in (47, -15):
            try:
                data = zlib.decompressobj(wbits).decompress(body, _SCAN_BYTES)
                break
            except zlib.error:
                continue
    elif encoding == "identity":
        data = body[:_SCAN_BYTES]
    else:  # br, zstd, ...: not readable here, so no marker matches
        return ""
    return data.decode("utf-8", "replace").lower()


# -- budget -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Budget:
    """One deadline for the whole request across the chain, and a cap on attempts.

    Times are on the caller's clock (monotonic seconds). What counts as an attempt is the
    caller's choice; entries skipped by their circuit are not attempts.
    """

    deadline: float
    max_attempts: int

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

    @classmethod
    def start(cls, now: float, total_s: float, max_attempts: int) -> Budget:
        return cls(deadline=now + total_s, max_attempts=max_attempts)

    def remaining(self, now: float) -> float:
        """Seconds left before the deadline, never negative."""
        return max(0.0, self.deadline - now)

    def allows_attempt(self, now: float, attempts_made: int) -> bool:
        """True if another attempt may start: time is left and the cap is not reached."""
        return attempts_made < self.max_attempts and now < self.deadline


def first_byte_timeout(budget: Budget, now: float, entry_first_byte_s: float | None) -> float:
    """An attempt's first-byte timeout: its entry's own, cut to what the budget has left.

    `entry_first_byte_s=None` means the entry sets none: the budget's remainder applies.
    """
    remaining = budget.remaining(now)
    if entry_first_byte_s is None:
        return remaining
    return min(entry_first_byte_s, remaining)
