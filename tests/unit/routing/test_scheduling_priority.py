"""`scheduling: priority`: the body a backend gets carries the client key's priority as
vLLM's `priority`, in place of the client's; other backends get the body as sent."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.api.protocol import PROXIED
from app.routing.exchange import Call
from app.routing.local import PRIORITY_PATHS, local_body
from app.routing.registry import Route
from app.settings.endpoints import Api
from app.settings.keys import Priority
from tests.unit.lifecycle.test_backend_lifecycle import GatedRuntime, make_backend

ROUTE = Route(name="alias", backend="b", upstream_model="m")


def call(path: str, api: Api, priority: Priority, **fields: Any) -> Call:
    # The backend's own model name: the body changes only for the priority (an alias's
    # model, put in by the same single rewrite, is covered by tests/api/test_body_relay.py).
    payload = {"model": "m", "priority": -9, **fields}
    raw = json.dumps(payload).encode()
    return Call(ROUTE, path, payload, False, raw, {}, api=api, priority=priority)


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", Api.CHAT),
        ("/v1/completions", Api.COMPLETIONS),
        ("/v1/embeddings", Api.EMBEDDINGS),
        ("/v1/responses", Api.RESPONSES),
        ("/pooling", Api.POOLING),
        ("/classify", Api.CLASSIFY),
        ("/score", Api.SCORE),
        ("/v1/score", Api.SCORE),
        ("/rerank", Api.RERANK),
        ("/v1/rerank", Api.RERANK),
        ("/v2/rerank", Api.RERANK),
    ],
)
@pytest.mark.parametrize(("priority", "vllm"), [("high", -1), ("normal", 0), ("low", 1)])
def test_a_priority_backend_gets_the_keys_priority_in_place_of_the_clients(
    path: str, api: Api, priority: str, vllm: int
) -> None:
    backend = make_backend(GatedRuntime(), scheduling="priority")
    sent = call(path, api, Priority(priority), input="x \udcff")
    body, _ = local_body(backend, sent, sent.body)
    assert json.loads(body) == {"model": "m", "priority": vllm, "input": "x \udcff"}


def test_a_fcfs_backend_gets_the_body_byte_for_byte() -> None:
    backend = make_backend(GatedRuntime())
    sent = call("/v1/chat/completions", Api.CHAT, Priority.HIGH)
    assert local_body(backend, sent, sent.body)[0] is sent.body


@pytest.mark.parametrize(
    ("path", "api", "method", "content_type"),
    [
        ("/v1/responses/resp_1/cancel", Api.RESPONSES, "POST", "application/json"),
        ("/v1/responses/resp_1", Api.RESPONSES, "GET", "application/json"),
        ("/tokenize", Api.TOKENIZE, "POST", "application/json"),
        ("/v1/chat/completions", Api.CHAT, "POST", "multipart/form-data; boundary=x"),
    ],
)
def test_requests_vllm_takes_no_priority_in_are_sent_as_they_are(
    path: str, api: Api, method: str, content_type: str
) -> None:
    backend = make_backend(GatedRuntime(), scheduling="priority")
    base = call(path, api, Priority.HIGH)
    sent = Call(
        ROUTE, path, base.payload, False, base.body, {}, api=api, method=method,
        content_type=content_type, priority=Priority.HIGH,
    )  # fmt: skip
    assert local_body(backend, sent, sent.body)[0] is sent.body


# Proxied routes whose vLLM request model has no `priority` (or that vLLM does not serve):
# a client's value there is ignored by vLLM, so the body goes as it is.
_NO_PRIORITY = {
    "/tokenize",
    "/detokenize",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/audio/speech",
    "/v1/images/generations",
    "/v1/images/edits",
}


def test_every_proxied_route_is_either_given_the_keys_priority_or_takes_none() -> None:
    """A route added to the gateway must be placed on one side or the other: one vLLM
    schedules by `priority` and missing here would let a client's value through."""
    paths = {endpoint.path for endpoint in PROXIED}
    assert paths - _NO_PRIORITY == set(PRIORITY_PATHS)
    assert all(PRIORITY_PATHS[e.path] is e.api for e in PROXIED if e.path in PRIORITY_PATHS)
