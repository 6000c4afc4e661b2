"""What goes into an upstream call and what comes back: `Call` (one client request,
routed) and `Exchange` (an opened upstream response with its lease), for a local backend
and for a fallback chain alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from app.errors import UpstreamError
from app.keys.ring import KeyUse
from app.lifecycle.key_turns import NO_KEY, KeyShare
from app.lifecycle.lease import Lease, WaitNotice
from app.routing.registry import Route
from app.settings.endpoints import Api
from app.settings.keys import Priority
from app.upstreams.http import Relayable
from app.upstreams.provider import ProviderRequest
from app.upstreams.usage import TokenCounter, usage_in_tail

# Turns an answer in the translated API back into the client's, within `within_s`.
AnswerTranslator = Callable[[Relayable, float], Awaitable[Relayable]]


@dataclass(frozen=True, slots=True)
class Call:
    """One client request, routed: what the dispatcher needs to open it anywhere.

    `body` is what the route's own backend gets (its served model name put in); a chain
    builds other entries' bodies from `payload` (or, for a form, from `body`).
    `translated` is the same request in another API, for a target that does not serve
    `api` (Anthropic's Messages as OpenAI chat), with the way back for its answer."""

    route: Route
    path: str
    payload: dict[str, Any]
    stream: bool
    body: bytes
    headers: dict[str, str]
    api: Api = Api.CHAT
    method: str = "POST"
    content_type: str = "application/json"
    translated: Translated | None = None
    # The client key's priority: its place in a backend's queue, and vLLM's `priority`.
    priority: Priority = Priority.NORMAL
    # The client key's hold (limits, tokens, whether it may reach the cloud); None: no key.
    key: KeyUse | None = None
    # The gateway asked for the stream's usage on the key's behalf: the relay strips it.
    usage_added: bool = False
    # What the caller accepts to wait for a cold chain entry (`x-microscheduler-max-wait`,
    # read at the API's edge with the body: `app.routing.patience.parse_max_wait`).
    max_wait_s: float | None = None

    @property
    def share(self) -> KeyShare:
        """Its client key as a backend's queue takes turns by it (name and weight)."""
        if self.key is None:
            return NO_KEY
        key = self.key.key
        return KeyShare(key.name, key.config.weight)

    def provider_request(self) -> ProviderRequest:
        return ProviderRequest(
            self.path,
            self.payload,
            self.stream,
            api=self.api,
            method=self.method,
            raw=self.body,
            content_type=self.content_type,
        )

    def apis(self) -> tuple[Api, ...]:
        """The APIs a target may serve to take this call, in order of preference."""
        if self.translated is None:
            return (self.api,)
        return (self.api, self.translated.call.api)

    def for_target(
        self, serves: Callable[[Api], bool]
    ) -> tuple[Call, AnswerTranslator | None] | None:
        """This call as a target that `serves` some APIs takes it: as is, translated (with
        the answer's way back), or None when it can take neither."""
        if serves(self.api):
            return self, None
        if self.translated is not None and serves(self.translated.call.api):
            translated = self.translated.call
            if translated.priority is not self.priority:  # the key's, whatever the API
                translated = replace(translated, priority=self.priority)
            return translated, self.translated.answer
        return None


@dataclass(frozen=True, slots=True)
class Translated:
    call: Call
    answer: AnswerTranslator


class Notice(Protocol):
    """The relay's keep-alive for a streaming client held while a backend wakes: called
    as the route's own `WaitNotice`, or made for another backend a chain waits for."""

    @property
    def started(self) -> bool: ...

    def __call__(self, waited_s: float, detail: str | None) -> Awaitable[None]: ...

    def for_backend(self, backend: str) -> WaitNotice: ...


class ExchangeHooks(Protocol):
    """What a fallback chain learns after the first byte (circuits, provider outcomes)."""

    def stream_failed(self, exchange: Exchange, error: UpstreamError) -> None: ...

    def finished(self, exchange: Exchange) -> None: ...


class Exchange:
    """An upstream response in progress and the lease that goes with it.

    `backend` is the entry that answers (a backend, or a provider for a chain: `cloud`);
    `headers` are added to the response (a chain's `x-microscheduler-*`). Its tokens
    count for the entry (`tokens`) and the client's key (`key`), and are kept in `usage`
    (the request's activity entry), read from the end of the body unless `tail_usage` is
    False (a translated stream counts them itself)."""

    __slots__ = (
        "_lease",
        "backend",
        "cloud",
        "completed",
        "headers",
        "hooks",
        "key",
        "response",
        "route",
        "tail_usage",
        "tokens",
        "usage",
    )

    def __init__(
        self,
        route: Route,
        backend: str,
        response: Relayable,
        lease: Lease | None,
        *,
        headers: list[tuple[bytes, bytes]] | None = None,
        tokens: TokenCounter | None = None,
        hooks: ExchangeHooks | None = None,
        cloud: bool = False,
        tail_usage: bool = True,
    ) -> None:
        self.route = route
        self.backend = backend
        self.response = response
        self._lease = lease
        self.headers = headers
        self.tokens = tokens
        self.hooks = hooks
        self.cloud = cloud
        self.tail_usage = tail_usage
        self.key: KeyUse | None = None
        self.completed = False
        self.usage: tuple[int, int] | None = None  # (prompt, completion), once counted

    def body_done(self, tail: bytes) -> None:
        """The body was relayed to its end; `tail` is its last bytes (usage is read there)."""
        self.completed = True
        if self.tail_usage:
            usage = usage_in_tail(tail)
            if usage is not None:
                self.count(*usage)

    def count(self, prompt: int, completion: int) -> None:
        """The answer's tokens, for its entry and its client's key: the one place they are
        counted (read by `app.upstreams.usage`), and once per answer whoever reports them
        (the stripped usage event, the body's tail, a translated stream's hooks)."""
        if self.usage is not None:
            return
        self.usage = (prompt, completion)
        if self.tokens is not None:
            self.tokens.add(prompt, completion)
        if self.key is not None:
            self.key.count(self.backend, self.cloud, prompt, completion)

    def finish(self) -> None:
        """Give back the connection (pooled if the body was read to its end) and the lease."""
        try:
            self.response.release()
        finally:
            if self._lease is not None:
                self._lease.release()
            if self.hooks is not None:
                self.hooks.finished(self)
