"""Opening a request on a local backend: the one path a plain request, a replica group's
member and a fallback chain's local entry all take (lease first, then the upstream; errors
counted once). Once the caller holds the backend's lease: `served_target` (the call as the
woken server takes it, else the lease back), `open_entry` (the upstream opened:
`open_local`), then `LocalAnswer.relayable` (the answer translated back when the call was
translated); a failure at any step gives the lease (and the response) back.

`local_body` is the one place a JSON body for a local backend is written, from the call's
payload (parsed once, by the route) and at most once, only when something changes: the
backend's model name (an alias), the stream's usage asked for on the key's behalf, the
key's `priority` (`scheduling: priority`), and a `max_tokens` the server cannot give
lowered to its `max_model_len`; otherwise the client's bytes are relayed untouched.

vLLM 0.33 refuses `max_tokens > max_model_len` with a 400 ("max_tokens=32000 cannot be greater than
max_model_len=8192", vllm/renderers/params.py `TokenizeParams.__post_init__`) but clamps
prompt + max_tokens to the context itself (vllm/entrypoints/serve/utils/api_utils.py
`get_max_tokens`), so `max_model_len` is the largest value it takes. The field checked is
the request's own (`build_tok_params`): chat's `max_completion_tokens` or `max_tokens`
(chat_completion/protocol.py), completions' `max_tokens` (completion/protocol.py),
responses' `max_output_tokens` (responses/protocol.py), and native Messages' `max_tokens`
(anthropic/serving.py makes it chat's `max_tokens` and `max_completion_tokens`); a
Messages `thinking.budget_tokens` must stay below it (anthropic/protocol.py), so it is
lowered with it. The answer says so in `x-microscheduler-max-tokens-lowered: 32000->8192`;
`lower_max_tokens: false` on a backend sends the body as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import Counter

from app.errors import UpstreamError
from app.jsonwire import json_bytes
from app.lifecycle.lease import Lease
from app.routing.exchange import AnswerTranslator, Call
from app.routing.routed import RoutedBackend
from app.settings.endpoints import Api
from app.upstreams.http import Relayable, UpstreamResponse
from app.upstreams.multipart import boundary_of

# vLLM's request models with a `priority` field, by gateway path: ChatCompletionRequest,
# CompletionRequest, ResponsesRequest (the create only: not GET/DELETE/cancel of an id), and
# every pooling request (embeddings, pooling, classify, score, rerank: all built on
# `PoolingBasicRequestMixin`, vllm/entrypoints/pooling/base/protocol.py). The rest take
# none and are sent as they are: the tokenizer routes (never scheduled), the audio forms
# (`TranscriptionRequest` has no `priority`) and native `/v1/messages`
# (`AnthropicMessagesRequest` ignores unknown fields); vLLM ignores a client's `priority`
# there, so it cannot move a request ahead of others.
PRIORITY_PATHS: Final = {
    "/v1/chat/completions": Api.CHAT,
    "/v1/completions": Api.COMPLETIONS,
    "/v1/responses": Api.RESPONSES,
    "/v1/embeddings": Api.EMBEDDINGS,
    "/pooling": Api.POOLING,
    "/classify": Api.CLASSIFY,
    "/score": Api.SCORE,
    "/v1/score": Api.SCORE,
    "/rerank": Api.RERANK,
    "/v1/rerank": Api.RERANK,
    "/v2/rerank": Api.RERANK,
}


# The output-length fields vLLM checks against max_model_len, by gateway path, in the order
# it reads them (chat reads `max_completion_tokens` first).
TOKEN_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "/v1/chat/completions": ("max_completion_tokens", "max_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
    "/v1/messages": ("max_tokens",),
}
LOWERED_HEADER: Final = b"x-microscheduler-max-tokens-lowered"


# vLLM names a created response after the request's `request_id` (a vLLM extra field,
# vllm/entrypoints/openai/responses/protocol.py `ResponsesRequest.request_id`: the
# response's `id`, and its key in the server's store). A client naming one could take over
# another key's stored response, so the gateway drops it: vLLM draws a random one.
RESPONSES_CREATE: Final = "/v1/responses"


def local_body(backend: RoutedBackend, call: Call, body: bytes) -> tuple[bytes, bytes | None]:
    """`body` for `backend`, and the `LOWERED_HEADER` value when a token limit was lowered.

    The one place a JSON body for a local backend is written, from `call.payload`, once,
    and only when it changes: the payload names another model than the backend's (an
    alias, a chain's entry serving another model), the gateway asked for the stream's
    usage (`call.usage_added`), on a backend with `scheduling: priority` a JSON request
    vLLM takes `priority` in gets the client key's (replacing any the client sent: a
    client must not raise its own), or a `max_tokens` (see the module docstring) above the
    backend's learned `max_model_len` is lowered to it, or a Responses create names its
    own `request_id` (dropped: `RESPONSES_CREATE`). Otherwise `body` (the client's
    bytes) is sent as it is, never written again; so is a form (its model is replaced in
    the raw bytes by the caller) and a body without a `model` (a stored response's call)."""
    if not is_json_post(call):
        return body, None
    payload = call.payload
    update: dict[str, Any] = {}
    if backend.config.scheduling == "priority" and PRIORITY_PATHS.get(call.path) is call.api:
        update["priority"] = call.priority.vllm
    lowered = _lowered(backend, call, update)
    model = call.route.upstream_model  # a LoRA adapter's own name; else the served id
    if backend.name not in call.route.members:  # a chain's entry serving another model
        model = backend.config.served_model
    named = payload.get("model")
    chosen_id = call.path == RESPONSES_CREATE and "request_id" in payload
    if update or chosen_id or call.usage_added or (named is not None and named != model):
        sent = {**payload, "model": model, **update}
        if chosen_id:
            del sent["request_id"]
        return json_bytes(sent), lowered
    return body, None


def is_json_post(call: Call) -> bool:
    """A POST whose body is JSON: `local_body` writes it from the payload when it changes."""
    return call.method == "POST" and boundary_of(call.content_type) is None


def _lowered(backend: RoutedBackend, call: Call, update: dict[str, Any]) -> bytes | None:
    """Put the lowered token limits in `update`; the header value for the first one."""
    limit = backend.serving.max_model_len
    fields = TOKEN_FIELDS.get(call.path)
    if limit is None or fields is None or not backend.config.lower_max_tokens:
        return None
    payload = call.payload
    said: bytes | None = None
    for name in fields:
        value = payload.get(name)
        if type(value) is int and value > limit:
            update[name] = limit
            if said is None:
                said = f"{value}->{limit}".encode()
    thinking = payload.get("thinking")
    if said is not None and call.path == "/v1/messages" and isinstance(thinking, dict):
        budget = thinking.get("budget_tokens")
        if type(budget) is int and budget >= limit:
            update["thinking"] = {**thinking, "budget_tokens": max(limit - 1, 0)}
    return said


async def open_local(
    backend: RoutedBackend,
    lease: Lease,
    call: Call,
    upstream_errors: Counter,
    *,
    body: bytes | None = None,
    first_byte_s: float | None = None,
) -> tuple[UpstreamResponse, list[tuple[bytes, bytes]]]:
    """Open `call` (its path, method, headers, and its body unless `body` replaces it) on
    the backend whose `lease` the caller holds, as `local_body` writes it (the key's
    priority, a `max_tokens` it cannot give lowered); with the headers the gateway adds to
    the answer for it (`LOWERED_HEADER`), which the caller puts on its `Exchange` (an
    answer translated back keeps them too).

    Transport failures and 5xx answers count in `microscheduler_upstream_errors_total`;
    on any failure the lease is released before the error propagates, so a held slot is
    never leaked. `first_byte_s` overrides the backend's first-byte timeout (a chain gives
    an attempt what is left of its deadline)."""
    try:
        sent, lowered = local_body(backend, call, call.body if body is None else body)
        response = await backend.upstream.open(
            call.path,
            sent,
            call.headers,
            first_byte_s=first_byte_s,
            method=call.method,
        )
    except UpstreamError as exc:
        lease.release()
        upstream_errors.labels(backend.name, exc.kind).inc()
        raise
    except BaseException:
        lease.release()
        raise
    if response.status >= 500:
        upstream_errors.labels(backend.name, "http_5xx").inc()
    return response, [] if lowered is None else [(LOWERED_HEADER, lowered)]


Target = tuple[Call, AnswerTranslator | None]


def served_target(call: Call, backend: RoutedBackend, lease: Lease) -> Target | None:
    """`call` as `backend` takes it (as is, or translated with the answer's way back),
    asked once its lease is held: its server says what it serves as it wakes. None: it
    takes the call no more, and the lease is released."""
    target = call.for_target(backend.serving.serves)
    if target is None:
        lease.release()
    return target


@dataclass(slots=True)
class LocalAnswer:
    """A local backend's answer, opened, with the lease it holds. The caller may judge it
    first (a chain's verdict: `discard` to move on) before `relayable` hands it over."""

    response: UpstreamResponse
    lease: Lease
    headers: list[tuple[bytes, bytes]]  # what the gateway adds (`LOWERED_HEADER`)
    answer: AnswerTranslator | None

    def discard(self) -> None:
        self.response.release()
        self.lease.release()

    async def relayable(self, first_byte_s: float) -> Relayable:
        """The answer to relay: translated back when the call was translated (within
        `first_byte_s`); on a failure the response and the lease are given back."""
        if self.answer is None:
            return self.response
        try:
            return await self.answer(self.response, first_byte_s)
        except BaseException:
            self.discard()
            raise


async def open_entry(
    backend: RoutedBackend,
    lease: Lease,
    target: Target,
    upstream_errors: Counter,
    *,
    body: bytes | None = None,
    first_byte_s: float | None = None,
) -> LocalAnswer:
    """Open `target` (from `served_target`) on `backend` (`open_local`: the lease is
    released, and the error counted, when it fails)."""
    sent, answer = target
    response, added = await open_local(
        backend, lease, sent, upstream_errors, body=body, first_byte_s=first_byte_s
    )
    return LocalAnswer(response, lease, added, answer)
