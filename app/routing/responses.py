"""Which entry created a stored response: `GET/DELETE /v1/responses/{id}` and
`/v1/responses/{id}/cancel` must reach the backend (or provider) that holds it.

vLLM keeps stored responses in its own memory, so the gateway only remembers the id ->
entry mapping, for `ttl_s` and at most `max_ids` ids (the oldest go first). Each client
key has a share of them, `max_ids_per_key`: a key over its share loses its own oldest id,
so one key creating responses in a loop cannot push every other key's ids out (ids made
without a key share one account). The id is read from the start of the answer: the `id`
of a response object, or of the `response.created` event that opens a stream (OpenAI and
vLLM both send it first).

vLLM keeps responses only when the server runs with `VLLM_ENABLE_RESPONSES_API_STORE=1`
(`vllm/envs.py`); without it `store` is silently ignored and every follow-up, and every
create naming a `previous_response_id`, answers 404 `Response with id '<id>' not found.`
(`vllm/entrypoints/openai/responses/serving.py` `_make_not_found_error`). `not_stored`
turns that 404 into an error saying so.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from app.errors import ResponseNotFound
from app.routing.exchange import Call
from app.routing.registry import Route
from app.upstreams.http import Relayable

logger = logging.getLogger(__name__)

_RESPONSE_ID: Final = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_\-.]{1,200})"')
_SCAN_BYTES: Final = 64 * 1024
_VLLM_NOT_FOUND: Final = "Response with id '"  # vLLM's message, as it starts
STORE_ENV: Final = "VLLM_ENABLE_RESPONSES_API_STORE=1"


def created_response_id(first_chunk: bytes) -> str | None:
    """The id of the response an answer's first bytes create, if they name one."""
    match = _RESPONSE_ID.search(first_chunk, 0, _SCAN_BYTES)
    return match.group(1).decode() if match else None


@dataclass(frozen=True, slots=True)
class StoredAt:
    entry: str  # the backend or provider that answered
    route: Route  # the model the client named
    expires: float
    key: str | None = None  # the client key that created it: only it may follow it up


class ResponseIds:
    def __init__(
        self,
        *,
        ttl_s: float = 3600.0,
        max_ids: int = 10_000,
        max_ids_per_key: int = 1_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._max_ids = max_ids
        self._max_per_key = min(max_ids_per_key, max_ids)
        self._clock = clock
        self._ids: OrderedDict[str, StoredAt] = OrderedDict()  # oldest first
        # Each key's ids, oldest first (None: requests without a key).
        self._by_key: dict[str | None, OrderedDict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def held_by(self, key: str | None) -> int:
        """How many ids `key` holds now."""
        return len(self._by_key.get(key, ()))

    def remember(self, response_id: str, entry: str, route: Route, key: str | None = None) -> None:
        """Map `response_id` to where it is stored, for `key`. An id another key holds
        stays that key's (never taken over: the gateway drops a client's own choice of
        id, so only a provider could repeat one)."""
        now = self._clock()
        held = self.lookup(response_id)
        if held is not None and held.key != key:
            logger.warning("response id already held by another key, not taken over "
                           "response_id=%s entry=%s", response_id, entry)  # fmt: skip
            return
        self.forget(response_id)
        self._ids[response_id] = StoredAt(entry, route, now + self._ttl_s, key)
        own = self._by_key.setdefault(key, OrderedDict())
        own[response_id] = None
        self._expire(now)
        while len(own) > self._max_per_key:  # over its share: its own oldest go
            self.forget(next(iter(own)))
        while len(self._ids) > self._max_ids:
            self.forget(next(iter(self._ids)))

    def lookup(self, response_id: str) -> StoredAt | None:
        self._expire(self._clock())
        return self._ids.get(response_id)

    def forget(self, response_id: str) -> None:
        stored = self._ids.pop(response_id, None)
        if stored is None:
            return
        own = self._by_key.get(stored.key)
        if own is not None:
            own.pop(response_id, None)
            if not own:
                del self._by_key[stored.key]

    def _expire(self, now: float) -> None:
        while self._ids:
            oldest_id, oldest = next(iter(self._ids.items()))
            if oldest.expires > now:
                return
            self.forget(oldest_id)


def not_stored(
    call: Call, backend: str, answer: Relayable, response_id: str | None
) -> ResponseNotFound | None:
    """The error for a local vLLM's 404 `answer` to a call that needs a stored response
    (a follow-up of `response_id`, or a create naming `previous_response_id`) when the
    404 is vLLM's "Response with id ... not found"; None for any other answer."""
    if response_id is None:
        previous = call.payload.get("previous_response_id")
        if call.method != "POST" or not isinstance(previous, str):
            return None
        response_id, param = previous, "previous_response_id"
    else:
        param = "response_id"
    upstream = _error_message(answer) if answer.complete else None
    if upstream is None or not upstream.startswith(_VLLM_NOT_FOUND):
        return None
    return ResponseNotFound(
        response_id,
        message=(
            f"Backend '{backend}' does not hold the response '{response_id}' (it answered: "
            f"{upstream[:300]}). vLLM keeps responses only when its server runs with "
            f"{STORE_ENV} in its environment, and only in memory: a restart forgets them."
        ),
        param=param,
    )


def _error_message(answer: Relayable) -> str | None:
    try:
        body = json.loads(answer.first_chunk)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None
