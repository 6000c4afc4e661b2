"""A start is ready only on an answer from our own server (issue 31, point 2): the model ids
its `/v1/models` lists (pure), a start whose server lists other models fails as
`port_in_use` with ours stopped, and a health pass counts only while the runtime says our
server still runs."""

from __future__ import annotations

import json

import httpx
import pytest

from app.errors import BackendUnavailable
from app.lifecycle.metrics import LifecycleMetrics as Metrics
from app.lifecycle.served import Served
from app.lifecycle.server import NotOurServer, Server, StartFailed
from app.lifecycle.state import BackendState, failure_kind, refusal
from app.settings import BackendConfig
from app.upstreams.vllm import VllmClient
from app.upstreams.vllm_learned import models_of, not_ours
from tests.fakes.runtimes import FakeRuntime
from tests.unit.lifecycle.test_backend_lifecycle import LAZY, GatedRuntime, make_backend


def model_list(*ids: str) -> bytes:
    cards = [{"id": i, "object": "model"} for i in ids]
    return json.dumps({"object": "list", "data": cards}).encode()


# -- the decision (pure) ----------------------------------------------------------------


def test_the_ids_of_a_model_list() -> None:
    assert models_of(model_list("a", "b")) == ("a", "b")
    assert models_of(b'{"data": [{"id": "a"}, {"id": 3}, "x", {}]}') == ("a",)
    assert models_of(b'{"data": []}') == ()
    assert models_of(b"not json") is None
    assert models_of(b'{"detail": "Not Found"}') is None
    assert models_of(b"[]") is None


def test_a_server_that_lists_our_model_may_be_ours() -> None:
    assert not_ours(("lazy-model", "my-lora"), "lazy-model") is None
    assert not_ours(None, "lazy-model") is None  # no list: not known, as before


def test_a_server_that_lists_other_models_is_not_ours_and_what_it_serves_is_bounded() -> None:
    assert not_ours(("other-model",), "lazy-model") == "'other-model'"
    assert not_ours((), "lazy-model") == "no model"
    listed = not_ours(("m0", "m1", "m2", "m3", "m4", "x" * 500), "lazy-model")
    assert listed == "'m0', 'm1', 'm2' and 3 more"
    long = not_ours(("x" * 500,), "lazy-model")
    assert long == repr("x" * 80 + "...")


def test_a_failure_whose_reason_says_port_in_use_is_refused_as_such() -> None:
    reason = "port_in_use: port 8001 of backend 'b' already answers before its launch (...)"
    assert failure_kind(reason) == "port_in_use"
    assert failure_kind("exited with code 1 before it was ready") == "failed"
    assert failure_kind(None) == "failed"
    refused = refusal("b", BackendState.FAILED, reason, retry_in_s=4.2)
    assert refused.code == "backend_port_in_use"
    assert refused.status == 503
    assert refused.headers == {"retry-after": "5"}
    assert refused.message == f"backend 'b' failed: {reason}"


# -- the server's I/O ---------------------------------------------------------------------


def server_answering(runtime: FakeRuntime, models: httpx.Response) -> Server:
    def answer(request: httpx.Request) -> httpx.Response:
        return models if request.url.path == "/v1/models" else httpx.Response(404)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return Server("b", runtime, VllmClient(client, "http://127.0.0.1:8001"), Metrics())


def served() -> Served:
    return Served(BackendConfig(url="http://127.0.0.1:8001", models=["lazy-model"]))


async def test_a_server_listing_other_models_at_a_start_is_not_ours_and_ours_is_stopped() -> None:
    runtime = FakeRuntime()
    runtime.running = True
    server = server_answering(runtime, httpx.Response(200, content=model_list("other-model")))
    with pytest.raises(NotOurServer) as info:
        await server.learn(["lazy-model"], served(), ours="lazy-model")
    assert str(info.value) == (
        "port_in_use: the server at http://127.0.0.1:8001 lists 'other-model' in /v1/models, "
        "not 'lazy-model' (backends.b.models[0]): another server answers on its port, or ours "
        "serves the model under another name (--served-model-name); stopped ours"
    )
    assert runtime.stops == 1


@pytest.mark.parametrize(
    "models",
    [
        httpx.Response(200, content=model_list("lazy-model")),
        httpx.Response(401, json={"error": "unauthorized"}),  # not known: as before
        httpx.Response(200, content=b"<html>"),
    ],
    ids=["ours", "not-200", "not-a-list"],
)
async def test_a_server_that_may_be_ours_is_learned_from(models: httpx.Response) -> None:
    runtime = FakeRuntime()
    server = server_answering(runtime, models)
    assert await server.learn(["lazy-model"], served(), ours="lazy-model")
    assert runtime.stops == 0


async def test_outside_a_start_the_models_listed_decide_nothing() -> None:
    runtime = FakeRuntime()
    server = server_answering(runtime, httpx.Response(200, content=model_list("other-model")))
    assert await server.learn(["lazy-model"], served())
    assert runtime.stops == 0


async def test_a_health_pass_counts_only_while_the_runtime_says_ours_runs() -> None:
    """Ours died between two status reads (`Address already in use`) and another server
    answers the health check: the start fails (before: ready on the other's answer)."""
    runtime = FakeRuntime()
    runtime.running = True
    checks = 0

    def health(request: httpx.Request) -> httpx.Response:
        nonlocal checks
        checks += 1
        if checks == 1:
            return httpx.Response(503)  # ours, loading
        runtime.exit(1, "exited (1)")  # ours is gone; another server answers from now on
        return httpx.Response(200)

    client = httpx.AsyncClient(transport=httpx.MockTransport(health))
    server = Server("b", runtime, VllmClient(client, "http://127.0.0.1:8001"), Metrics())
    with pytest.raises(StartFailed, match="exited with code 1 before it was ready"):
        await server.wait_healthy(5.0)


# -- the backend ---------------------------------------------------------------------------


async def test_a_start_answered_by_another_server_fails_as_port_in_use() -> None:
    def other_server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, content=model_list("other-model"))
        return httpx.Response(200)

    runtime = GatedRuntime()
    runtime.gate.set()
    backend = make_backend(runtime, other_server, **LAZY)
    with pytest.raises(BackendUnavailable) as info:
        await backend.requests.acquire()
    assert info.value.code == "backend_port_in_use"
    assert "lists 'other-model' in /v1/models, not 'm'" in info.value.message
    assert backend.state is BackendState.FAILED
    assert runtime.stops == 1  # ours stopped
    assert not runtime.running
