"""The gateway as users run it: `microscheduler serve` (uvicorn) in front of fake vLLM
processes, driven by the official `openai` SDK."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import require_tool
from tests.fakes.processes import (
    GatewayProcess,
    fake_vllm_process,
    free_port,
    gateway_process,
)
from tests.fakes.promtool import check_metrics
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

KEY = "e2e-client-key"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "tell me a story"}]


class Upstreams:
    fast: str
    paced: str  # 20 tokens/s: chunks 50 ms apart
    slow: str  # 30 s before the first token


@pytest.fixture(scope="module")
def upstreams() -> Iterator[Upstreams]:
    with ExitStack() as stack:
        ups = Upstreams()
        ups.fast = stack.enter_context(fake_vllm_process("nemotron-8b", "--max-tokens", "8"))
        ups.paced = stack.enter_context(
            fake_vllm_process("paced-model", "--tokens-per-second", "20", "--max-tokens", "10")
        )
        ups.slow = stack.enter_context(
            fake_vllm_process("slow-model", "slow-stalled", "--ttft", "30")
        )
        yield ups


@pytest.fixture(scope="module")
def gw(upstreams: Upstreams) -> Iterator[GatewayProcess]:
    config = {
        "backends": {
            "orchestrator": {
                "url": upstreams.fast,
                "models": ["nemotron-8b"],
                "aliases": ["orchestrator", "default"],
                # the fake serves every API; a real vLLM, those of one runner
                "endpoints": ["chat", "completions", "embeddings", "responses", "tokenize"],
            },
            "paced": {"url": upstreams.paced, "models": ["paced-model"]},
            "slow": {"url": upstreams.slow, "models": ["slow-model"]},
            "stalled": {
                "url": upstreams.slow,
                "models": ["slow-stalled"],
                "timeouts": {"first_byte_s": 0.5},
            },
            "typo": {"url": upstreams.fast, "models": ["not-loaded-upstream"]},
            "dead": {"url": f"http://127.0.0.1:{free_port()}", "models": ["dead-model"]},
        }
    }
    env = {"MICROSCHEDULER_API_KEYS": KEY, "MICROSCHEDULER_MAX_BODY_BYTES": "65536"}
    with gateway_process(config, env=env) as running:
        yield running


@pytest.fixture
def client(gw: GatewayProcess) -> Iterator[openai.OpenAI]:
    # Closed after the test: its keep-alive sockets are not left to the garbage collector.
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=20) as sdk:
        yield sdk


def fake_stats(url: str) -> dict[str, int]:
    stats: dict[str, int] = httpx.get(url + "/_fake/stats").json()
    return stats


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="default", messages=MESSAGES)
    assert reply.model == "nemotron-8b"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 8


def test_streaming_chunks_arrive_one_by_one(client: openai.OpenAI) -> None:
    arrivals: list[float] = []
    content = []
    stream = client.chat.completions.create(
        model="paced-model",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        arrivals.append(time.monotonic())
        if chunk.choices and chunk.choices[0].delta.content:
            content.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert len(content) == 10
    assert usage is not None
    assert usage.completion_tokens == 10
    # The upstream paces tokens 50 ms apart; a buffering relay would deliver them in a burst.
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert sum(gap > 0.025 for gap in gaps) >= 8, gaps
    assert arrivals[-1] - arrivals[0] > 0.4


def test_completions_embeddings_and_models(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="nemotron-8b", prompt="once upon", max_tokens=3)
    assert completion.choices[0].text
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3
    embedding = client.embeddings.create(model="orchestrator", input=["a", "b"])
    assert len(embedding.data) == 2
    assert embedding.data[0].embedding
    ids = [m.id for m in client.models.list()]
    assert ids[:3] == ["nemotron-8b", "orchestrator", "default"]
    assert "dead-model" in ids
    alias = client.models.retrieve("default")  # an alias, as the SDK asks for one
    assert (alias.id, alias.owned_by) == ("default", "orchestrator")
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-9")
    assert info.value.code == "model_not_found"


def test_wrong_or_missing_key_is_401(gw: GatewayProcess) -> None:
    for key in ("wrong", ""):
        # `with_options` copies the client onto the same connection pool: closed with it.
        with openai.OpenAI(base_url=gw.url + "/v1", api_key=key or "x", max_retries=0) as sdk:
            bad = sdk if key else sdk.with_options(default_headers={"Authorization": ""})
            with pytest.raises(openai.AuthenticationError) as info:
                bad.models.list()
        assert info.value.status_code == 401
        assert info.value.code == "invalid_api_key"
    assert httpx.get(gw.url + "/health").status_code == 200  # open
    assert httpx.get(gw.url + "/metrics").status_code == 200  # open


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert info.value.code == "model_not_found"
    assert "gpt-9" in info.value.message


def test_invalid_bodies_are_400(gw: GatewayProcess) -> None:
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    for body in (b"{nope", b'{"messages": []}', b'{"model": 1, "messages": []}'):
        response = httpx.post(gw.url + "/v1/chat/completions", content=body, headers=headers)
        assert response.status_code == 400, body
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_body_over_the_limit_is_413(client: openai.OpenAI) -> None:
    big: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x" * 70_000}]
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="default", messages=big)
    assert info.value.status_code == 413
    assert info.value.code == "request_too_large"


def test_unreachable_upstream_is_503(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="dead-model", messages=MESSAGES)
    assert info.value.status_code == 503
    assert info.value.code == "upstream_unavailable"


def test_upstream_first_byte_timeout_is_504(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="slow-stalled", messages=MESSAGES)
    assert info.value.status_code == 504
    assert info.value.code == "upstream_timeout"


def test_upstream_4xx_is_relayed(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="not-loaded-upstream", messages=MESSAGES)
    assert "does not exist" in info.value.message  # vLLM's own words, relayed


def test_failure_mid_stream_ends_with_in_band_error(
    client: openai.OpenAI, upstreams: Upstreams
) -> None:
    httpx.post(upstreams.paced + "/_fake/faults", json={"drop_after": 3}).raise_for_status()
    received: list[object] = []
    try:
        stream = client.chat.completions.create(
            model="paced-model",
            messages=MESSAGES,
            stream=True,
        )
        with pytest.raises(openai.APIError) as info:
            received.extend(stream)
    finally:
        httpx.post(upstreams.paced + "/_fake/faults", json={"drop_after": None})
    assert len(received) == 3
    assert "broke off the response" in info.value.message


def test_client_disconnect_mid_stream_reaches_the_upstream(
    gw: GatewayProcess, upstreams: Upstreams
) -> None:
    before = fake_stats(upstreams.paced)["aborted"]
    body = {"model": "paced-model", "messages": MESSAGES, "stream": True, "max_tokens": 200}
    headers = {"authorization": f"Bearer {KEY}"}
    with (
        httpx.Client(timeout=10) as http,
        http.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers) as resp,
    ):
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
    # The client has closed the connection: the fake upstream must see its request aborted.
    until_sync(lambda: fake_stats(upstreams.paced)["aborted"] == before + 1, timeout_s=5)
    assert fake_stats(upstreams.paced)["in_flight"] == 0


def test_client_disconnect_before_the_first_byte_reaches_the_upstream(
    gw: GatewayProcess, upstreams: Upstreams
) -> None:
    before = fake_stats(upstreams.slow)["aborted"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": "slow-model", "messages": MESSAGES},
            headers={"authorization": f"Bearer {KEY}"},
            timeout=httpx.Timeout(5, read=0.5),
        )
    until_sync(lambda: fake_stats(upstreams.slow)["aborted"] == before + 1, timeout_s=5)
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'backend="slow",endpoint="chat_completions",model="slow-model",status="499"' in metrics


def test_metrics_pass_promtool(gw: GatewayProcess, client: openai.OpenAI) -> None:
    promtool = require_tool("promtool")
    client.chat.completions.create(model="default", messages=MESSAGES)
    text = httpx.get(gw.url + "/metrics").text
    for family in (
        "microscheduler_requests_total",
        "microscheduler_request_duration_seconds",
        "microscheduler_time_to_first_byte_seconds",
        "microscheduler_upstream_errors_total",
        "microscheduler_requests_in_flight",
    ):
        assert f"# TYPE {family.removesuffix('_total')}" in text, family
    check_metrics(promtool, text)


def test_ready_reports_every_backend(gw: GatewayProcess) -> None:
    until_sync(lambda: httpx.get(gw.url + "/ready").json()["backends"]["dead"]["healthy"] is False)
    # One backend is down, so the gateway is not ready, and says which and why.
    response = httpx.get(gw.url + "/ready")
    assert response.status_code == 503
    backends = response.json()["backends"]
    assert backends["orchestrator"]["ready"] is True
    dead = backends["dead"]
    assert (dead["ready"], dead["state"], dead["healthy"]) == (False, "ready", False)
    assert dead["reason"].startswith("not managed: external server at http://127.0.0.1:")
    assert dead["health_error"].startswith("ConnectError")


def test_gateway_logs_no_key(gw: GatewayProcess) -> None:
    assert KEY not in gw.log()
    assert KEY not in httpx.get(gw.url + "/metrics").text
    assert json.dumps(KEY) not in httpx.get(gw.url + "/ready").text
