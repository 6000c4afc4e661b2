"""The fallback chain as users run it: `microscheduler serve` (uvicorn) with a
`cloud_providers.yaml`, a fake vLLM process as the local backends, another as an
OpenAI-compatible cloud provider, the fake Anthropic API as a process, and the official
`openai` SDK as the client (streams parsed by it, timing real)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from tests.e2e.conftest import require_tool
from tests.fakes.processes import (
    ROOT,
    GatewayProcess,
    fake_vllm_process,
    free_port,
    gateway_process,
    stop,
    wait_for,
)
from tests.fakes.promtool import check_metrics

pytestmark = pytest.mark.e2e

VAST_KEY = "sk-e2e-vast-LEAKCHECK-4821"
CLAUDE_KEY = "sk-ant-e2e-LEAKCHECK-9377"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "tell me a story"}]
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@contextlib.contextmanager
def fake_anthropic_process(key_env: str, env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.sim.anthropic", "--port", str(port),
         "--api-key-env", key_env],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/_fake/stats", timeout_s=20, proc=proc)
        yield url
    finally:
        stop(proc)


class World:
    local: str
    cloud: str
    claude: str
    gw: GatewayProcess


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    keys = {"E2E_VAST_KEY": VAST_KEY, "E2E_CLAUDE_KEY": CLAUDE_KEY}
    with ExitStack() as stack:
        w = World()
        w.local = stack.enter_context(
            fake_vllm_process("reasoning-model", "--model", "orch-model", "--max-tokens", "6")
        )
        w.cloud = stack.enter_context(
            fake_vllm_process("cloud-model", "--max-tokens", "5", "--tokens-per-second", "50")
        )
        w.claude = stack.enter_context(fake_anthropic_process("E2E_CLAUDE_KEY", keys))
        config = tmp_path_factory.mktemp("fallback-config")
        models = {
            "backends": {
                "reasoning": {
                    "url": w.local,
                    "models": ["reasoning-model"],
                    "aliases": ["reasoning"],
                    "role": "reasoning",
                    "timeouts": {"first_byte_s": 1},
                },
                "orchestrator": {
                    "url": w.local,
                    "models": ["orch-model"],
                    "aliases": ["orchestrator"],
                    "role": "orchestrator",
                },
            }
        }
        cloud = {
            "providers": {
                "vast": {
                    "kind": "openai",
                    "base_url": w.cloud + "/v1",
                    "api_key_env": "E2E_VAST_KEY",
                    "model": "cloud-model",
                },
                "claude": {
                    "kind": "anthropic",
                    "base_url": w.claude,
                    "api_key_env": "E2E_CLAUDE_KEY",
                    "model": "claude-e2e",
                    "max_tokens": 256,
                },
            },
            "chains": {
                "reasoning": ["reasoning", "vast"],
                "orchestrator": ["claude", "orchestrator"],
            },
            # High enough that the tests of this module do not open circuits for each other.
            "circuit": {"failure_threshold": 100},
        }
        (config / "models.yaml").write_text(yaml.safe_dump(models))
        (config / "cloud_providers.yaml").write_text(yaml.safe_dump(cloud))
        w.gw = stack.enter_context(
            gateway_process(config_dir=config, env={**keys, "MICROSCHEDULER_LOG_LEVEL": "DEBUG"})
        )
        yield w


@pytest.fixture
def client(world: World) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=world.gw.url + "/v1", api_key="unused", max_retries=0, timeout=20
    ) as sdk:
        yield sdk
    for url in (world.local, world.cloud):
        reset = {"fail_status": None, "stall_before_headers": None, "drop_after": None}
        httpx.post(url + "/_fake/faults", json=reset).raise_for_status()
    httpx.post(world.claude + "/_fake/faults", json={"fail_status": None, "reply": None})


def faults(url: str, **values: Any) -> None:
    httpx.post(url + "/_fake/faults", json=values).raise_for_status()


def requests_to(url: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(url + "/_fake/stats").json()["requests"]
    return found


def test_a_stream_falls_back_before_its_first_byte(world: World, client: openai.OpenAI) -> None:
    faults(world.local, fail_status=503, fail_count=1)
    raw = client.chat.completions.with_raw_response.create(
        model="reasoning", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    assert raw.headers["x-microscheduler-route"] == "vast"
    assert raw.headers["x-microscheduler-fallbacks"] == "1; reasoning=unavailable"
    chunks = list(raw.parse())
    assert {c.model for c in chunks} == {"cloud-model"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    sent = requests_to(world.cloud)[-1]
    assert sent["headers"]["authorization"] == f"Bearer {VAST_KEY}"
    assert sent["body"]["model"] == "cloud-model"


def test_a_stall_before_the_first_byte_falls_back(world: World, client: openai.OpenAI) -> None:
    faults(world.local, stall_before_headers=True)
    started = time.monotonic()
    reply = client.chat.completions.create(model="reasoning", messages=MESSAGES)
    elapsed = time.monotonic() - started
    assert reply.model == "cloud-model"
    assert 1.0 <= elapsed < 5


def test_a_failure_after_content_ends_in_band_and_asks_no_one_else(
    world: World, client: openai.OpenAI
) -> None:
    before = len(requests_to(world.cloud))
    faults(world.local, drop_after=3)
    stream = client.chat.completions.create(model="reasoning", messages=MESSAGES, stream=True)
    content: list[str] = []

    def read_all() -> None:
        for chunk in stream:
            content.append(chunk.choices[0].delta.content or "")

    with pytest.raises(openai.APIError):
        read_all()
    assert "".join(content)  # content reached the client before the failure
    assert len(requests_to(world.cloud)) == before


def test_anthropic_tool_calls_stream_through_the_sdk(world: World, client: openai.OpenAI) -> None:
    faults(world.claude, reply="tool_use")
    with client.chat.completions.stream(
        model="orchestrator",
        messages=MESSAGES,
        tools=TOOLS,
        stream_options={"include_usage": True},
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.model == "claude-e2e"
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    assert final.usage is not None
    assert final.usage.completion_tokens > 0


def test_anthropic_overloaded_falls_back_to_the_local_model(
    world: World, client: openai.OpenAI
) -> None:
    faults(world.claude, fail_status=529, fail_count=1)
    raw = client.chat.completions.with_raw_response.create(
        model="orchestrator", messages=MESSAGES, stream=True
    )
    assert raw.headers["x-microscheduler-fallbacks"] == "1; claude=overloaded"
    assert {c.model for c in raw.parse()} == {"orch-model"}


def test_metrics_pass_promtool(world: World, client: openai.OpenAI) -> None:
    promtool = require_tool("promtool")
    client.chat.completions.create(model="orchestrator", messages=MESSAGES)
    text = httpx.get(world.gw.url + "/metrics").text
    for name in (
        "microscheduler_fallbacks_total",
        "microscheduler_provider_requests_total",
        "microscheduler_circuit_open",
        "microscheduler_tokens_total",
    ):
        assert f"\n{name}{{" in text
    check_metrics(promtool, text)  # the lead's shared check (dcgm's label names aside)


def test_no_key_in_logs_status_metrics_or_error_bodies(world: World, client: openai.OpenAI) -> None:
    faults(world.local, fail_status=500, fail_count=1)
    faults(world.cloud, fail_status=500, fail_count=1)
    failed = httpx.post(
        world.gw.url + "/v1/chat/completions",
        json={"model": "reasoning", "messages": MESSAGES},
        timeout=20,
    )
    assert failed.status_code == 503
    assert failed.json()["error"]["code"] == "fallback_exhausted"
    status = httpx.get(world.gw.url + "/status")
    assert status.status_code == 200
    fallback = status.json()["fallback"]
    assert fallback["providers"]["vast"]["key_present"] is True
    assert fallback["chains"]["reasoning"]["entries"] == ["reasoning", "vast"]
    assert any(e["kind"] == "fallback" for e in status.json()["events"])
    texts = [
        failed.text,
        json.dumps(dict(failed.headers)),
        httpx.get(world.gw.url + "/metrics").text,
        status.text,
        httpx.get(world.gw.url + "/ready").text,
        world.gw.log(),
    ]
    for key in (VAST_KEY, CLAUDE_KEY):
        for text in texts:
            assert key not in text
            assert key[-8:] not in text
