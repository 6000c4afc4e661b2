"""Waits priced in: how long a request through a fallback chain accepts to wait for a cold
local entry, and whether to wait at all. Pure: no I/O, no clock.

What the caller accepts (`accepted_wait`), the first that is set:

1. the request header `x-microscheduler-max-wait: 5` (seconds, `0` to `MAX_WAIT_CAP_S`;
   anything else is a 400 naming the header);
2. the client key's `max_wait_s` (keys.yaml);
3. the chain's `max_wait_s` (cloud_providers.yaml).

None of them: the chain waits as before (`wake_timeout_s`). Otherwise a local entry that
is not the chain's last is passed over at once, reason `cold_start_budget`, when it is
cold (stopped, asleep, or still starting) and its learned time to ready (its last measured
cold start or wake, less what a start in progress has done: `Backend.ready_in_s`) is longer
than the accepted wait; its start is begun (or left going) so that a later request finds
it ready. Without a learned duration nothing is priced: the chain waits as before. A
cold entry with a learned duration within the accepted wait is waited for at most the
accepted wait (and never longer than `wake_timeout_s`). The last entry of a chain, and a
model without a chain, wait as before whatever the caller accepts.

The answer says what was priced: `x-microscheduler-fallbacks` names the entry with
`cold_start_budget`, and `x-microscheduler-expected-wake: reasoning=42.0s` gives the
expected time to ready of each entry passed over so.
"""

from __future__ import annotations

import math
import re
from typing import Final

from app.errors import InvalidRequest

MAX_WAIT_HEADER: Final = "x-microscheduler-max-wait"
EXPECTED_WAKE_HEADER: Final = b"x-microscheduler-expected-wake"
MAX_WAIT_CAP_S: Final = 3600.0
_SECONDS: Final = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,3})?")


def parse_max_wait(value: str | None) -> float | None:
    """The header's seconds (None when absent); 400 when it is not a plain number of
    seconds within 0 to `MAX_WAIT_CAP_S`."""
    if value is None:
        return None
    text = value.strip()
    seconds = float(text) if _SECONDS.fullmatch(text) else math.nan
    if not 0 <= seconds <= MAX_WAIT_CAP_S:
        raise InvalidRequest(
            f"The header {MAX_WAIT_HEADER} must be a number of seconds from 0 to "
            f"{MAX_WAIT_CAP_S:g} (e.g. 5 or 2.5), not {text[:20]!r}.",
            param=MAX_WAIT_HEADER,
        )
    return seconds


def accepted_wait(
    header_s: float | None, key_s: float | None, chain_s: float | None
) -> float | None:
    """What the caller accepts to wait for a cold entry: the header's, else its key's,
    else its chain's `max_wait_s`; None: nothing said (wait as before)."""
    for seconds in (header_s, key_s, chain_s):
        if seconds is not None:
            return seconds
    return None


def priced_out(ready_in_s: float | None, accepted_s: float | None) -> bool:
    """Whether a local entry expected ready in `ready_in_s` (None: not known; 0: ready) is
    passed over at once for a caller who accepts `accepted_s`."""
    if ready_in_s is None or accepted_s is None:
        return False
    return ready_in_s > accepted_s


def expected_wake_header(priced: list[tuple[str, float]]) -> bytes:
    """`reasoning=42.0s` (`; ` between entries) for `x-microscheduler-expected-wake`."""
    return "; ".join(f"{name}={seconds:.1f}s" for name, seconds in priced).encode()
