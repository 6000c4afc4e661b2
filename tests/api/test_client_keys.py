"""Client keys (keys.yaml) through the official `openai` SDK: scope, 401/403/429 with their
headers, token limits counted from usage (streams with and without `include_usage`),
`cloud: false` and the daily cloud budget on a fallback chain, per-key metrics and /status.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam

from app.lifecycle.blocks import BlockKind
from app.services import Services
from app.settings import Settings
from tests.fakes.provider import cloud_settings, fake_anthropic, fake_openai_provider
from tests.fakes.servers import Gateway, fake_vllm, gateway, gateway_settings, sdk_http
from tests.fakes.waits import until

AGENTS, BATCH, FAMILY = "sk-agents-1f2e", "sk-batch-9a8b", "sk-family-77c1"
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def metric(gw: Gateway, name: str, **labels: str) -> float:
    value = gw.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTS_KEY", AGENTS)
    monkeypatch.setenv("BATCH_KEY", BATCH)


Client = Callable[[str], openai.AsyncOpenAI]


@asynccontextmanager
async def keyed(settings: Settings) -> AsyncIterator[tuple[Gateway, Client]]:
    """The gateway and an `openai` client factory (one per secret), no retries."""
    async with gateway(settings) as gw, sdk_http(gw) as http:

        def client(secret: str) -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(
                api_key=secret, base_url="http://gateway/v1", http_client=http, max_retries=0
            )

        yield gw, client


@asynccontextmanager
async def two_models(keys: dict[str, Any], **vllm: Any) -> AsyncIterator[tuple[Gateway, Client]]:
    async with (
        fake_vllm(models=["orchestrator"], **vllm) as orch,
        fake_vllm(models=["reasoning"], **vllm) as reason,
    ):
        settings = gateway_settings(
            {
                "orchestrator": {"url": orch.url, "models": ["orchestrator"]},
                "reasoning": {"url": reason.url, "models": ["reasoning"], "aliases": ["think"]},
            },
            client_keys={"keys": keys},
        )
        async with keyed(settings) as pair:
            yield pair


async def test_a_key_lists_and_uses_only_its_models() -> None:
    keys = {"agents": {"key_env": "AGENTS_KEY", "models": ["orchestrator", "think"]}}
    async with two_models(keys) as (gw, client):
        sdk = client(AGENTS)
        listed = [m.id async for m in sdk.models.list()]
        assert listed == ["orchestrator", "think"]
        answer = await sdk.chat.completions.create(model="orchestrator", messages=HI)
        assert answer.choices[0].message.content
        assert (await sdk.chat.completions.create(model="think", messages=HI)).choices
        for call in (
            sdk.chat.completions.create(model="reasoning", messages=HI),
            sdk.models.retrieve("reasoning"),
        ):
            with pytest.raises(openai.PermissionDeniedError) as info:
                await call
            assert info.value.status_code == 403
            assert info.value.code == "model_not_allowed"
            assert "'reasoning'" in info.value.message
            assert "'agents'" in info.value.message
        assert (
            metric(gw, "microscheduler_key_requests_total", key="agents", outcome="forbidden") == 2
        )
        assert metric(gw, "microscheduler_key_requests_total", key="agents", outcome="served") == 2


async def test_an_unknown_or_missing_key_is_401() -> None:
    async with two_models({"agents": {"key_env": "AGENTS_KEY"}}) as (gw, client):
        with pytest.raises(openai.AuthenticationError) as info:
            await client("sk-not-a-key").chat.completions.create(model="orchestrator", messages=HI)
        assert info.value.code == "invalid_api_key"
        response = await gw.client.post("/v1/chat/completions", json={"model": "x"})
        assert response.status_code == 401


async def test_a_key_may_be_given_as_its_sha256() -> None:
    keys = {"family": {"key_sha256": sha256(FAMILY)}}
    async with two_models(keys) as (gw, client):
        answer = await client(FAMILY).chat.completions.create(model="reasoning", messages=HI)
        assert answer.choices
        assert metric(gw, "microscheduler_key_requests_total", key="family", outcome="served") == 1


async def test_requests_per_minute_429_with_retry_after_and_ratelimit_headers() -> None:
    keys = {"agents": {"key_env": "AGENTS_KEY", "rpm": 2}}
    async with two_models(keys) as (gw, client):
        sdk = client(AGENTS)
        remaining = []
        for _ in range(2):
            raw = await sdk.chat.completions.with_raw_response.create(
                model="orchestrator", messages=HI
            )
            assert raw.headers["x-ratelimit-limit-requests"] == "2"
            remaining.append(raw.headers["x-ratelimit-remaining-requests"])
            assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
        assert remaining == ["1", "0"]
        with pytest.raises(openai.RateLimitError) as info:
            await sdk.chat.completions.create(model="orchestrator", messages=HI)
        error = info.value
        assert error.status_code == 429
        assert error.code == "rate_limit_exceeded"
        assert "requests per min (RPM): Limit 2, Used 2" in error.message
        headers = error.response.headers
        assert 1 <= int(headers["retry-after"]) <= 60
        assert headers["x-ratelimit-limit-requests"] == "2"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert "x-ratelimit-limit-tokens" not in headers  # no tpm on this key
        assert metric(gw, "microscheduler_key_limited_total", key="agents", limit="rpm") == 1
        assert (
            metric(gw, "microscheduler_key_requests_total", key="agents", outcome="rate_limited")
            == 1
        )


async def test_max_concurrent_refuses_a_request_beyond_the_key_s_in_flight_limit() -> None:
    keys = {"agents": {"key_env": "AGENTS_KEY", "max_concurrent": 1}}
    async with two_models(keys, tokens_per_second=20, max_tokens=10) as (gw, client):
        sdk = client(AGENTS)
        (key,) = gw.app.state.services.plane.keys.keys
        first = asyncio.create_task(
            sdk.chat.completions.create(model="orchestrator", messages=HI)
        )  # about 0.5 s of generation
        await until(lambda: key.in_flight == 1, what="the first request in flight")
        with pytest.raises(openai.RateLimitError) as info:
            await sdk.chat.completions.create(model="reasoning", messages=HI)
        assert "max_concurrent" in info.value.message
        assert info.value.response.headers["retry-after"] == "1"
        assert (await first).choices
        # The first one's end gave its slot back.
        assert (await sdk.chat.completions.create(model="reasoning", messages=HI)).choices
        assert (
            metric(gw, "microscheduler_key_limited_total", key="agents", limit="max_concurrent")
            == 1
        )


@pytest.mark.parametrize("mode", ["plain", "stream_with_usage", "stream_without_usage"])
async def test_tokens_per_minute_are_counted_from_usage(mode: str) -> None:
    keys = {"batch": {"key_env": "BATCH_KEY", "tpm": 8}}
    async with two_models(keys, max_tokens=8) as (gw, client):
        sdk = client(BATCH)
        fields: dict[str, Any] = {}
        if mode != "plain":
            fields["stream"] = True
        if mode == "stream_with_usage":
            fields["stream_options"] = {"include_usage": True}
        raw = await sdk.chat.completions.with_raw_response.create(
            model="orchestrator", messages=HI, **fields
        )
        assert raw.headers["x-ratelimit-limit-tokens"] == "8"
        assert raw.headers["x-ratelimit-remaining-tokens"] == "8"  # counted once it ends
        text = (await raw.http_response.aread()).decode()
        events = [json.loads(line[6:]) for line in text.splitlines()
                  if line.startswith("data: {")]  # fmt: skip
        if mode == "plain":
            used = json.loads(text)["usage"]
        elif mode == "stream_with_usage":
            assert events[-1]["choices"] == []
            assert events[-1]["usage"]
            used = events[-1]["usage"]
        else:
            # The usage the gateway asked for on the key's behalf is not relayed.
            assert '"usage"' not in text
            assert all(e["choices"] for e in events)
            assert text.rstrip().endswith("data: [DONE]")
            used = None
        prompt = metric(
            gw, "microscheduler_key_tokens_total", key="batch", route="orchestrator", type="prompt"
        )
        completion = metric(
            gw,
            "microscheduler_key_tokens_total",
            key="batch",
            route="orchestrator",
            type="completion",
        )
        assert completion == 8
        if used is not None:
            assert (prompt, completion) == (used["prompt_tokens"], used["completion_tokens"])
        assert prompt + completion >= 8
        with pytest.raises(openai.RateLimitError) as info:
            await sdk.chat.completions.create(model="orchestrator", messages=HI)
        assert "tokens per min (TPM): Limit 8" in info.value.message
        headers = info.value.response.headers
        assert headers["x-ratelimit-remaining-tokens"] == "0"
        assert 1 <= int(headers["retry-after"]) <= 60
        assert metric(gw, "microscheduler_key_limited_total", key="batch", limit="tpm") == 1


@asynccontextmanager
async def chain(keys: dict[str, Any]) -> AsyncIterator[tuple[Gateway, Client, Any]]:
    """`reasoning` falls back to the provider `cloud`; its local backend is yielded."""
    async with (
        fake_vllm(models=["reasoning"], max_tokens=4) as local,
        fake_openai_provider("sk-provider") as cloud,
    ):
        settings = cloud_settings(
            {"reasoning": {"url": local.url, "models": ["reasoning"]}},
            {"cloud": {"kind": "openai", "base_url": cloud.base_url,
                       "api_key_env": "PROVIDER_KEY", "model": "cloud-model"}},
            {"reasoning": ["reasoning", "cloud"]},
            client_keys={"keys": keys},
        )  # fmt: skip
        async with keyed(settings) as (gw, client):
            services: Services = gw.app.state.services
            services.backends["reasoning"].block("game", "a game", kind=BlockKind.YIELDED)
            yield gw, client, cloud


async def test_a_cloud_false_key_never_reaches_a_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVIDER_KEY", "sk-provider")
    keys = {"batch": {"key_env": "BATCH_KEY", "cloud": False}, "agents": {"key_env": "AGENTS_KEY"}}
    async with chain(keys) as (gw, client, cloud):
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as info:
                await client(BATCH).chat.completions.create(
                    model="reasoning", messages=HI, stream=stream
                )
            assert info.value.status_code == 503
            assert "a game" in info.value.message  # the local reason
            assert "key_no_cloud" in info.value.message
        assert cloud.calls == 0
        # A key that may use the cloud gets the provider's answer.
        answer = await client(AGENTS).chat.completions.create(model="reasoning", messages=HI)
        assert answer.choices
        assert cloud.calls == 1
        assert metric(gw, "microscheduler_key_requests_total", key="batch", outcome="error") == 2


async def test_daily_cloud_tokens_keep_a_key_off_the_cloud_once_spent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PROVIDER_KEY", "sk-provider")
    keys = {"agents": {"key_env": "AGENTS_KEY", "daily_cloud_tokens": 5}}
    async with chain(keys) as (gw, client, cloud):
        sdk = client(AGENTS)
        stream = await sdk.chat.completions.create(model="reasoning", messages=HI, stream=True)
        async for _ in stream:
            pass
        assert cloud.calls == 1
        spent = metric(
            gw, "microscheduler_key_tokens_total", key="agents", route="cloud", type="completion"
        )
        assert spent > 0
        with pytest.raises(openai.APIStatusError) as info:
            await sdk.chat.completions.create(model="reasoning", messages=HI)
        assert info.value.status_code == 503
        assert "key_cloud_budget" in info.value.message
        assert cloud.calls == 1
        assert (
            metric(gw, "microscheduler_key_limited_total", key="agents", limit="daily_cloud_tokens")
            == 1
        )
        status = (await gw.client.get("/status")).json()
        (view,) = status["keys"]
        assert view["cloud_tokens_today"] >= 5
        assert view["daily_cloud_tokens"] == 5


async def test_status_and_metrics_name_keys_but_never_their_secrets() -> None:
    keys = {
        "agents": {"key_env": "AGENTS_KEY", "models": ["orchestrator"], "priority": "high",
                   "rpm": 10, "tpm": 1000, "max_concurrent": 2},
        "family": {"key_sha256": sha256(FAMILY)},
    }  # fmt: skip
    async with two_models(keys) as (gw, client):
        await client(AGENTS).chat.completions.create(model="orchestrator", messages=HI)
        status = (await gw.client.get("/status")).json()
        views = {k["name"]: k for k in status["keys"]}
        assert set(views) == {"agents", "family"}
        agents = views["agents"]
        assert agents["priority"] == "high"
        assert agents["models"] == ["orchestrator"]
        assert agents["requests_last_minute"] == 1
        assert agents["rpm"] == 10
        assert agents["tokens_last_minute"] > 0
        assert agents["in_flight"] == 0
        assert agents["requests"]["served"] == 1
        text = status_text = json.dumps(status) + (await gw.client.get("/metrics")).text
        assert 'microscheduler_key_requests_total{key="agents",outcome="served"} 1.0' in text
        for secret in (AGENTS, FAMILY, sha256(FAMILY), "AGENTS_KEY"):
            assert secret not in status_text


async def test_a_stored_response_is_followed_up_only_by_the_key_that_made_it() -> None:
    keys = {"agents": {"key_env": "AGENTS_KEY"}, "batch": {"key_env": "BATCH_KEY"}}
    async with two_models(keys, responses_store=True) as (_, client):
        created = await client(AGENTS).responses.create(model="orchestrator", input="hi")
        assert (await client(AGENTS).responses.retrieve(created.id)).id == created.id
        with pytest.raises(openai.NotFoundError):
            await client(BATCH).responses.retrieve(created.id)


async def test_keys_from_the_environment_still_work_beside_keys_yaml() -> None:
    async with fake_vllm(models=["m"]) as local:
        settings = gateway_settings(
            {"m": {"url": local.url, "models": ["m"]}},
            api_keys="sk-plain",
            client_keys={"keys": {"agents": {"key_env": "AGENTS_KEY"}}},
        )
        async with keyed(settings) as (gw, client):
            for secret in ("sk-plain", AGENTS):
                assert (
                    await client(secret).chat.completions.create(model="m", messages=HI)
                ).choices
            assert (
                metric(gw, "microscheduler_key_requests_total", key="api-key-1", outcome="served")
                == 1
            )


async def test_the_limits_hold_under_concurrent_requests() -> None:
    keys = {"agents": {"key_env": "AGENTS_KEY", "rpm": 5}}
    async with two_models(keys) as (_, client):
        sdk = client(AGENTS)
        results = await asyncio.gather(
            *(sdk.chat.completions.create(model="orchestrator", messages=HI) for _ in range(12)),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, openai.RateLimitError)]
        assert len(refused) == 7
        assert len(results) - len(refused) == 5


async def test_the_messages_api_uses_the_same_keys() -> None:
    keys = {"agents": {"key_env": "AGENTS_KEY", "models": ["orchestrator"], "rpm": 1}}
    async with two_models(keys) as (gw, _), sdk_http(gw) as http:

        def claude(secret: str) -> anthropic.AsyncAnthropic:
            return anthropic.AsyncAnthropic(
                base_url="http://gateway", api_key=secret, http_client=http, max_retries=0
            )

        hello: list[MessageParam] = [{"role": "user", "content": "hi"}]
        with pytest.raises(anthropic.AuthenticationError):
            await claude("sk-wrong").messages.create(
                model="orchestrator", max_tokens=8, messages=hello
            )
        with pytest.raises(anthropic.PermissionDeniedError) as denied:
            await claude(AGENTS).messages.create(model="reasoning", max_tokens=8, messages=hello)
        assert "'reasoning'" in denied.value.message
        answer = await claude(AGENTS).messages.create(
            model="orchestrator", max_tokens=8, messages=hello
        )
        assert answer.content
        with pytest.raises(anthropic.RateLimitError) as limited:
            await claude(AGENTS).messages.create(model="orchestrator", max_tokens=8, messages=hello)
        assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert 1 <= int(limited.value.response.headers["retry-after"]) <= 60
        assert limited.value.response.headers["x-ratelimit-remaining-requests"] == "0"
        tokens = metric(gw, "microscheduler_key_tokens_total", key="agents", route="orchestrator",
                        type="completion")  # fmt: skip
        assert tokens > 0  # a translated answer counts its usage for the key too


async def test_the_access_line_names_the_key_never_its_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="app.access")
    keys = {"agents": {"key_env": "AGENTS_KEY", "models": ["orchestrator"]}}
    async with fake_vllm(models=["orchestrator"]) as orch:
        settings = gateway_settings(
            {"orchestrator": {"url": orch.url, "models": ["orchestrator"]}},
            client_keys={"keys": keys},
            access_log=True,
        )
        async with keyed(settings) as (_, client):
            await client(AGENTS).chat.completions.create(model="orchestrator", messages=HI)
            with pytest.raises(openai.NotFoundError):
                await client(AGENTS).chat.completions.create(model="other", messages=HI)
    lines = [r.getMessage() for r in caplog.records if r.name == "app.access"]
    assert any("status=200" in line and "key=agents" in line for line in lines), lines
    assert any("status=404" in line and "key=agents" in line for line in lines), lines
    assert AGENTS not in caplog.text


async def test_a_stream_translated_from_anthropic_counts_the_keys_tokens_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The key counts tokens (tpm), so the gateway asks for include_usage; the Anthropic
    # provider's stream is translated and counted by the chain's hooks: the usage chunk
    # the gateway strips must not be counted a second time.
    monkeypatch.setenv("ANTHROPIC_TEST_KEY", "sk-ant")
    keys = {"batch": {"key_env": "BATCH_KEY", "tpm": 100000}}
    async with (
        fake_vllm(models=["reasoning"], max_tokens=4) as local,
        fake_anthropic("sk-ant") as claude,
    ):
        settings = cloud_settings(
            {"reasoning": {"url": local.url, "models": ["reasoning"]}},
            {"claude": {"kind": "anthropic", "base_url": claude.url,
                        "api_key_env": "ANTHROPIC_TEST_KEY", "model": "claude-test",
                        "max_tokens": 64}},
            {"reasoning": ["reasoning", "claude"]},
            client_keys={"keys": keys},
        )  # fmt: skip
        async with keyed(settings) as (gw, client):
            services: Services = gw.app.state.services
            services.backends["reasoning"].block("game", "a game", kind=BlockKind.YIELDED)
            sdk = client(BATCH)

            def completion_tokens() -> float:
                return metric(gw, "microscheduler_key_tokens_total", key="batch",
                              route="claude", type="completion")  # fmt: skip

            # Asked by the client: its usage chunk says what one answer costs.
            asked = await sdk.chat.completions.create(
                model="reasoning", messages=HI, stream=True, stream_options={"include_usage": True}
            )
            usage = [chunk.usage async for chunk in asked if chunk.usage is not None]
            assert len(usage) == 1
            one = usage[0].completion_tokens
            assert one > 0
            assert completion_tokens() == one
            # Not asked: the gateway adds it, strips it, and counts the answer once.
            plain = await sdk.chat.completions.create(model="reasoning", messages=HI, stream=True)
            assert all([chunk.usage is None async for chunk in plain])
            assert completion_tokens() == 2 * one
