"""Opening a request on a local backend: the one path a plain request and a fallback
chain's local entry both take (lease first, then the upstream; errors counted once)."""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter

from app.errors import UpstreamError
from app.jsonwire import json_bytes
from app.lifecycle.backend import Backend
from app.lifecycle.lease import Lease
from app.routing.exchange import Call
from app.settings.endpoints import Api
from app.upstreams.http import UpstreamResponse
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


def with_priority(backend: Backend, call: Call, body: bytes) -> bytes:
    """`body` for `backend`: on one with `scheduling: priority`, a JSON request vLLM takes
    `priority` in is written again from `call.payload` with the client key's priority
    (replacing any the client sent: a client must not raise its own) and the backend's
    model. Anything else, and every body for another backend, is sent as it is."""
    if (
        backend.config.scheduling != "priority"
        or call.method != "POST"
        or PRIORITY_PATHS.get(call.path) is not call.api
        or boundary_of(call.content_type) is not None
    ):
        return body
    model = call.route.upstream_model  # a LoRA adapter's own name; else the served id
    if backend.name not in call.route.members:  # a chain's entry serving another model
        model = backend.config.served_model
    payload = {**call.payload, "model": model}
    return json_bytes({**payload, "priority": call.priority.vllm})


async def open_local(
    backend: Backend,
    lease: Lease,
    call: Call,
    upstream_errors: Counter,
    *,
    body: bytes | None = None,
    first_byte_s: float | None = None,
) -> UpstreamResponse:
    """Open `call` (its path, method, headers, and its body unless `body` replaces it) on
    the backend whose `lease` the caller holds; with the key's priority on a backend with
    `scheduling: priority` (`with_priority`).

    Transport failures and 5xx answers count in `microscheduler_upstream_errors_total`;
    on any failure the lease is released before the error propagates, so a held slot is
    never leaked. `first_byte_s` overrides the backend's first-byte timeout (a chain gives
    an attempt what is left of its deadline)."""
    try:
        sent = with_priority(backend, call, call.body if body is None else body)
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
    return response
