"""The gateway in process in front of a real fake vLLM on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr

from app.settings import Settings
from tests.fakes.servers import FakeServer, Gateway, fake_vllm, gateway, gateway_settings

CHAT = {"model": "default", "messages": [{"role": "user", "content": "hello there"}]}


def one_backend(url: str, **extra: Any) -> Settings:
    backend = {"url": url, "models": ["nemotron-8b"], "aliases": ["default"], **extra}
    return gateway_settings({"orchestrator": backend})


@pytest.fixture
async def upstream() -> AsyncIterator[FakeServer]:
    async with fake_vllm(models=["nemotron-8b"], max_tokens=4) as server:
        yield server


@pytest.fixture
async def gw(upstream: FakeServer) -> AsyncIterator[Gateway]:
    async with gateway(one_backend(upstream.url)) as running:
        yield running


def assert_openai_error(body: dict[str, Any], code: str | None, type_: str) -> dict[str, Any]:
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["code"] == code
    assert error["type"] == type_
    return dict(error)


async def last_upstream_request(upstream: FakeServer) -> dict[str, Any]:
    requests = (await upstream.stats())["requests"]
    last: dict[str, Any] = requests[-1]
    return last


async def test_chat_by_alias_is_sent_upstream_with_the_first_model_id(
    gw: Gateway, upstream: FakeServer
) -> None:
    response = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "nemotron-8b"
    assert body["usage"]["completion_tokens"] == 4
    sent = await last_upstream_request(upstream)
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["model"] == "nemotron-8b"
    assert sent["body"]["messages"] == CHAT["messages"]


async def test_streaming_chat_is_relayed_as_server_sent_events(gw: Gateway) -> None:
    async with gw.client.stream(
        "POST", "/v1/chat/completions", json={**CHAT, "stream": True}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no"
        text = (await response.aread()).decode()
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_completions_and_embeddings_pass_through(upstream: FakeServer) -> None:
    settings = one_backend(upstream.url, endpoints=["chat", "completions", "embeddings"])
    async with gateway(settings) as gw:
        await _completions_and_embeddings(gw)


async def test_an_api_the_backend_does_not_serve_is_404_before_any_upstream_call() -> None:
    async with (
        fake_vllm(models=["nemotron-8b"], task="generate") as upstream,
        gateway(one_backend(upstream.url)) as gw,
    ):
        response = await gw.client.post("/v1/embeddings", json={"model": "default", "input": "a"})
        assert response.status_code == 404
        error = assert_openai_error(response.json(), "endpoint_not_served", "invalid_request_error")
        assert "backend 'orchestrator'" in error["message"]
        assert "/v1/embeddings" in error["message"]
        assert "endpoints:" in error["message"]
        assert (await upstream.stats())["requests"] == []


async def _completions_and_embeddings(gw: Gateway) -> None:
    completion = await gw.client.post(
        "/v1/completions", json={"model": "nemotron-8b", "prompt": "once upon", "max_tokens": 3}
    )
    assert completion.status_code == 200
    assert completion.json()["object"] == "text_completion"
    assert completion.json()["usage"]["completion_tokens"] == 3
    embedding = await gw.client.post("/v1/embeddings", json={"model": "default", "input": ["a"]})
    assert embedding.status_code == 200
    assert embedding.json()["data"][0]["object"] == "embedding"


async def test_model_list_has_every_id_and_alias(gw: Gateway) -> None:
    response = await gw.client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [(m["id"], m["root"], m["object"]) for m in body["data"]] == [
        ("nemotron-8b", "nemotron-8b", "model"),
        ("default", "nemotron-8b", "model"),
    ]


async def test_one_model_is_retrieved_by_id_or_alias(gw: Gateway) -> None:
    listed = (await gw.client.get("/v1/models")).json()["data"]
    for model in listed:
        response = await gw.client.get(f"/v1/models/{model['id']}")
        assert response.status_code == 200
        assert response.json() == model
    missing = await gw.client.get("/v1/models/gpt-9")
    assert missing.status_code == 404
    assert_openai_error(missing.json(), "model_not_found", "invalid_request_error")
    assert "'gpt-9'" in missing.json()["error"]["message"]
    slashed = await gw.client.get("/v1/models/Qwen/Qwen3-8B")  # ids may hold slashes
    assert slashed.json()["error"]["code"] == "model_not_found"


async def test_unknown_model_is_404_model_not_found(gw: Gateway, upstream: FakeServer) -> None:
    response = await gw.client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"})
    assert response.status_code == 404
    error = assert_openai_error(response.json(), "model_not_found", "invalid_request_error")
    assert "gpt-9" in error["message"]
    assert error["param"] == "model"
    assert (await upstream.stats())["requests"] == []  # nothing reached the upstream


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"{oops", "not valid JSON"),
        (b'{"messages": []}', "must provide a model"),
        (b'{"model": ["x"], "messages": []}', "expected a non-empty string"),
        (b'{"model": "default", "messages": [], "stream": "true"}', "'stream': expected a boolean"),
    ],
)
async def test_bad_bodies_are_400(gw: Gateway, content: bytes, fragment: str) -> None:
    response = await gw.client.post(
        "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = assert_openai_error(
        response.json(), response.json()["error"]["code"], "invalid_request_error"
    )
    assert fragment in error["message"]


async def test_body_over_the_limit_is_413(upstream: FakeServer) -> None:
    settings = one_backend(upstream.url).model_copy(update={"max_body_bytes": 1000})
    async with gateway(settings) as gw:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
        response = await gw.client.post("/v1/chat/completions", json=big)
        assert response.status_code == 413
        assert_openai_error(response.json(), "request_too_large", "invalid_request_error")

        async def chunked() -> AsyncIterator[bytes]:  # no content-length: counted while read
            for _ in range(5):
                yield b" " * 300

        response = await gw.client.post("/v1/chat/completions", content=chunked())
        assert response.status_code == 413


async def test_upstream_unreachable_is_503() -> None:
    async with gateway(one_backend("http://127.0.0.1:9")) as gw:
        response = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 503
        error = assert_openai_error(response.json(), "upstream_unavailable", "server_error")
        # The backend by its name and what went wrong; never its address.
        assert error["message"] == "backend 'orchestrator' did not answer: connection refused"
        metrics = (await gw.client.get("/metrics")).text
        assert (
            'microscheduler_upstream_errors_total{backend="orchestrator",kind="connect"} 1.0'
            in metrics
        )


async def test_no_first_byte_in_time_is_504(upstream: FakeServer) -> None:
    await upstream.set_faults(stall_before_headers=True)
    settings = one_backend(upstream.url, timeouts={"first_byte_s": 0.3})
    async with gateway(settings) as gw:
        response = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 504
        error = assert_openai_error(response.json(), "upstream_timeout", "server_error")
        assert "no response within 0.3s" in error["message"]


async def test_upstream_4xx_is_relayed_as_is(upstream: FakeServer) -> None:
    # The gateway knows a name the upstream does not serve: vLLM's own 404 comes back.
    settings = gateway_settings({"b": {"url": upstream.url, "models": ["not-loaded"]}})
    async with gateway(settings) as gw:
        direct = await upstream.client.post(
            "/v1/chat/completions", json={**CHAT, "model": "not-loaded"}
        )
        relayed = await gw.client.post("/v1/chat/completions", json={**CHAT, "model": "not-loaded"})
        assert relayed.status_code == direct.status_code == 404
        assert relayed.content == direct.content


async def test_upstream_5xx_is_relayed_and_counted(gw: Gateway, upstream: FakeServer) -> None:
    await upstream.set_faults(fail_status=500, fail_count=1)
    response = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 500
    metrics = (await gw.client.get("/metrics")).text
    assert 'upstream_errors_total{backend="orchestrator",kind="http_5xx"} 1.0' in metrics
    assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200


def sse_events(text: str) -> list[str]:
    return [e for e in text.split("\n\n") if e]


async def test_failure_after_first_byte_ends_with_error_event_and_done(
    gw: Gateway, upstream: FakeServer
) -> None:
    await upstream.set_faults(drop_after=2)
    response = await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))
    assert_openai_error(error, "upstream_unavailable", "server_error")
    assert len(events) == 2 + 2  # two relayed chunks, the error, [DONE]
    assert sum(e.startswith('data: {"error"') for e in events) == 1


async def test_stall_mid_stream_hits_the_idle_timeout(upstream: FakeServer) -> None:
    await upstream.set_faults(stall_after=1)
    async with gateway(one_backend(upstream.url, timeouts={"idle_s": 0.3})) as gw:
        response = await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        events = sse_events(response.text)
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))
        assert_openai_error(error, "upstream_timeout", "server_error")
        assert "sent nothing for 0.3s" in error["error"]["message"]


async def test_hop_by_hop_headers_and_our_credentials_stay_here(upstream: FakeServer) -> None:
    settings = one_backend(upstream.url).model_copy(
        update={"api_keys": (SecretStr("client-secret"),)}
    )
    async with gateway(settings) as gw:
        await gw.client.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={
                "authorization": "Bearer client-secret",
                "connection": "keep-alive, x-hop",
                "x-hop": "1",
                "keep-alive": "timeout=5",
                "te": "trailers",
                "x-custom": "kept",
            },
        )
    headers = (await last_upstream_request(upstream))["headers"]
    for name in ("authorization", "connection", "x-hop", "keep-alive", "te"):
        assert name not in headers
    assert headers["x-custom"] == "kept"
    assert headers["content-type"] == "application/json"


async def test_request_id_is_echoed_or_made(gw: Gateway) -> None:
    given = await gw.client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "abc"})
    assert given.headers["x-request-id"] == "abc"
    made = await gw.client.get("/v1/models")
    assert len(made.headers["x-request-id"]) == 16
    uuid = "0b7c2a5e-3f4d-4e1a-9c8b-7d6e5f4a3b2c"
    kept = await gw.client.get("/v1/models", headers={"x-request-id": uuid})
    assert kept.headers["x-request-id"] == uuid


@pytest.mark.parametrize(
    "forged", ["abc key=admin", "x path=/vram/yield", "a\tb", "é", "x" * 129, "a,b", "a;b"]
)
async def test_a_request_id_that_could_forge_log_fields_is_replaced(
    gw: Gateway, forged: str
) -> None:
    # Every log line of the request carries its id: a space or `=` in it would add fields.
    answer = await gw.client.get("/v1/models", headers={b"x-request-id": forged.encode()})
    made = answer.headers["x-request-id"]
    assert made != forged
    assert len(made) == 16
    assert all(c in "0123456789abcdef" for c in made)


async def test_unknown_path_and_method_use_the_envelope(gw: Gateway) -> None:
    missing = await gw.client.get("/v1/nothing")
    assert missing.status_code == 404
    assert_openai_error(missing.json(), "not_found", "invalid_request_error")
    wrong = await gw.client.get("/v1/chat/completions")
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "POST"
    assert_openai_error(wrong.json(), "method_not_allowed", "invalid_request_error")


async def test_request_metrics_are_labelled_from_config(gw: Gateway) -> None:
    await gw.client.post("/v1/chat/completions", json=CHAT)
    await gw.client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"})
    text = (await gw.client.get("/metrics")).text
    assert (
        'microscheduler_requests_total{backend="orchestrator",endpoint="chat_completions",'
        'model="default",status="200"} 1.0' in text
    )
    # An unknown name never becomes a label value.
    assert 'backend="",endpoint="chat_completions",model="",status="404"} 1.0' in text
    assert "gpt-9" not in text
    assert 'microscheduler_time_to_first_byte_seconds_count{backend="orchestrator"' in text
    assert 'microscheduler_requests_in_flight{backend="orchestrator"} 0.0' in text


async def test_an_unexpected_failure_on_the_fast_path_is_a_logged_500_in_the_envelope(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    services = gw.app.state.services

    def broken(model: str) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(services.plane.dispatcher, "route", broken)
    response = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 500
    assert_openai_error(response.json(), "internal_error", "server_error")
    assert "a bug" not in response.text  # the log has it, the client does not
    assert response.headers["x-request-id"]
    assert "unhandled error path=/v1/chat/completions" in caplog.text
    assert "RuntimeError: a bug" in caplog.text
    # Still counted like any request.
    sample = gw.registry.get_sample_value(
        "microscheduler_requests_total",
        {"model": "", "backend": "", "endpoint": "chat_completions", "status": "500"},
    )
    assert sample == 1.0
