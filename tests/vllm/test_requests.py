"""The request path against a real vLLM: a lazy backend woken by the first request (its
load phases seen in /status as it starts), then every API it serves through the gateway,
stream and not, with the real SDKs; `max_tokens` above the model's context lowered; the
model list as vLLM gives it.

One gateway and one server for the module: the first test wakes it, the rest use it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.fakes.processes import GatewayProcess, free_port, gateway_process
from tests.vllm.real import (
    ADMIN,
    KEY_ENV,
    MAX_MODEL_LEN,
    MODEL_ID,
    START_TIMEOUT_S,
    RealVllm,
    chat_body,
    status_of,
)

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


@pytest.fixture(scope="module")
def gateway(real_vllm: RealVllm) -> Iterator[GatewayProcess]:
    config = {"backends": {"tiny": real_vllm.backend(free_port())}}
    with gateway_process(config, env=KEY_ENV) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    # Closed with the module: its pool's keep-alive sockets would be left to the garbage
    # collector, which reports them (the collection after each module, tests/conftest.py).
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0,
                       timeout=120) as sdk:  # fmt: skip
        yield sdk


def test_the_first_request_wakes_it_and_status_shows_the_load(gateway: GatewayProcess) -> None:
    assert status_of(gateway.url, "tiny")["state"] == "stopped"
    answer: dict[str, Any] = {}

    def ask() -> None:
        body = chat_body(max_tokens=4)
        answer["response"] = httpx.post(
            gateway.url + "/v1/chat/completions", json=body, timeout=START_TIMEOUT_S
        )

    asking = threading.Thread(target=ask)
    asking.start()
    seen: list[tuple[str, int]] = []
    while asking.is_alive():
        load = status_of(gateway.url, "tiny")["load"]
        if load is not None:
            seen.append((load["phase"], load["percent"]))
        time.sleep(0.2)
    asking.join()
    response = answer["response"]
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]
    phases = list(dict.fromkeys(phase for phase, _ in seen))
    assert len(phases) >= 3, seen
    percents = [percent for _, percent in seen]
    assert percents == sorted(percents)
    # vLLM says what it does from its first seconds on (its arguments, the architecture,
    # the engine): the start is not "launching" for most of it.
    launching = sum(1 for phase, _ in seen if phase == "launching")
    assert launching < len(seen) / 2, seen
    ready = status_of(gateway.url, "tiny")
    assert ready["state"] == "ready"
    assert ready["load"] is None


def test_chat_and_completions_stream_and_not(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert chat.model == MODEL_ID
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 5
    chunks = list(
        client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            stream=True, stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    completion = client.completions.create(model=MODEL_ID, prompt="hello", max_tokens=5)
    assert completion.choices[0].text
    streamed = list(
        client.completions.create(model=MODEL_ID, prompt="hello", max_tokens=5, stream=True)
    )
    assert "".join(c.choices[0].text for c in streamed)


def test_responses_stream_and_not(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL_ID, input="hello", max_output_tokens=16)
    assert response.output_text
    events = list(
        client.responses.create(model=MODEL_ID, input="hello", max_output_tokens=16, stream=True)
    )
    assert events[-1].type == "response.completed"


def test_anthropic_messages_pass_through_stream_and_not(gateway: GatewayProcess) -> None:
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0) as claude:
        message = claude.messages.create(
            model=MODEL_ID, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
        assert message.type == "message"
        assert message.usage.output_tokens == 5
        with claude.messages.stream(
            model=MODEL_ID, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            final = stream.get_final_message()
    assert final.usage.output_tokens == 5
    # The real server serves /v1/messages itself (learned from its /openapi.json), so the
    # gateway passes it through instead of translating it to chat.
    served = status_of(gateway.url, "tiny")
    assert "messages" in served["apis"], served
    assert served["apis_from"] == "openapi"


def test_tokenize_and_detokenize(gateway: GatewayProcess) -> None:
    tokens = httpx.post(
        gateway.url + "/tokenize", json={"model": MODEL_ID, "prompt": "hello world"}, timeout=30
    )
    assert tokens.status_code == 200, tokens.text
    ids = tokens.json()["tokens"]
    assert tokens.json()["max_model_len"] == MAX_MODEL_LEN
    text = httpx.post(
        gateway.url + "/detokenize", json={"model": MODEL_ID, "tokens": ids}, timeout=30
    )
    assert text.status_code == 200, text.text
    assert text.json()["prompt"] == "hello world"


def prompt_of(gateway: GatewayProcess, tokens: int) -> str:
    """A prompt the real tokenizer makes `tokens` long, give or take the chat template."""
    unit = "hello world "
    count = httpx.post(
        gateway.url + "/tokenize", json={"model": MODEL_ID, "prompt": unit * 100}, timeout=30
    ).json()["count"]
    return unit * (tokens * 100 // int(count))


def test_max_tokens_above_the_context_is_lowered_on_every_api(gateway: GatewayProcess) -> None:
    # Claude Code asks for 32000; vLLM refuses max_tokens > max_model_len with a 400. The
    # prompt fills the context but ~60 tokens, so the clamped answer stays short on a CPU.
    prompt = prompt_of(gateway, MAX_MODEL_LEN - 60)
    calls: dict[str, dict[str, Any]] = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": prompt}]},
        "/v1/completions": {"prompt": prompt},
        "/v1/messages": {"messages": [{"role": "user", "content": prompt}]},
    }
    for path, fields in calls.items():
        body = {"model": MODEL_ID, "max_tokens": 32000, **fields}
        response = httpx.post(gateway.url + path, json=body, timeout=120)
        assert response.status_code == 200, (path, response.text)
        lowered = response.headers["x-microscheduler-max-tokens-lowered"]
        assert lowered == f"32000->{MAX_MODEL_LEN}", path


def test_the_model_list_keeps_vllms_max_model_len(client: openai.OpenAI) -> None:
    listed = {model.id: model for model in client.models.list()}
    assert MODEL_ID in listed
    extra = listed[MODEL_ID].model_extra
    assert extra is not None
    assert extra.get("max_model_len") == MAX_MODEL_LEN


def test_tools_without_the_servers_tool_flags_say_which_flags(gateway: GatewayProcess) -> None:
    # Claude Code always sends tools; vLLM refuses "auto" tool choice without its flags.
    tool = {"name": "get", "description": "d", "input_schema": {"type": "object"}}
    body = {"model": MODEL_ID, "max_tokens": 5, "tools": [tool],
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    response = httpx.post(gateway.url + "/v1/messages", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error"
    assert "--enable-auto-tool-choice" in error["error"]["message"]
    assert "--tool-call-parser" in error["error"]["message"]
    assert "docs/vllm.md#claude-code" in error["error"]["message"]
    function = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}
    chat = httpx.post(
        gateway.url + "/v1/chat/completions",
        json=chat_body(max_tokens=5, tools=[function]),
        timeout=60,
    )
    assert chat.status_code == 400
    assert "docs/vllm.md#claude-code" in chat.json()["error"]["message"]


def test_its_output_reaches_the_logs(gateway: GatewayProcess) -> None:
    logs = httpx.get(f"{gateway.url}/backends/tiny/logs?tail=400", headers=ADMIN, timeout=30)
    assert logs.status_code == 200
    assert "Starting vLLM server on http://127.0.0.1:" in logs.text
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in logs.text  # its access log runs
    # ... but without the gateway's polls (--disable-access-log-for-endpoints)
    assert '"GET /health HTTP/1.1"' not in logs.text
    assert '"GET /metrics HTTP/1.1"' not in logs.text
