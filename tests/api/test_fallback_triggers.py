"""Every fallback trigger and non-trigger, streaming and not, through real local servers:
the gateway in process, a fake vLLM as the local backend and a fake OpenAI-compatible
provider (both on 127.0.0.1). Each case makes one entry fail in one way and checks who
answered, the headers, and who was (not) asked."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.lifecycle.blocks import BlockKind
from app.runtimes.base import Runtime, RuntimeFailure
from app.services import Seams, Services
from app.settings import BackendConfig
from tests.fakes.processes import free_port
from tests.fakes.provider import FakeProvider, cloud_settings, fake_openai_provider
from tests.fakes.runtimes import FakeRuntime
from tests.fakes.servers import FakeServer, FakeVllmRuntime, Gateway, fake_vllm, gateway

KEY = "sk-test-cloud-0123456789"
LOCAL_MODEL = "local-model"
CLOUD_MODEL = "cloud-model"


@dataclass
class World:
    gw: Gateway
    local: FakeServer
    cloud: FakeProvider

    @property
    def services(self) -> Services:
        services: Services = self.gw.app.state.services
        return services


async def ask(gw: Gateway, *, stream: bool, **extra: Any) -> httpx.Response:
    body = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}], **extra}
    if stream:
        body["stream"] = True
    return await gw.client.post("/v1/chat/completions", json=body)


def events(response: httpx.Response) -> list[str]:
    return [e for e in response.text.split("\n\n") if e and not e.startswith(":")]


def answer(response: httpx.Response, stream: bool) -> tuple[str, str]:
    """(model, content) of a successful answer, checking the stream is well formed."""
    assert response.status_code == 200, response.text
    if not stream:
        body = response.json()
        return body["model"], body["choices"][0]["message"]["content"]
    found = events(response)
    assert found[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in found[:-1]]
    assert all("error" not in c for c in chunks), chunks
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return chunks[0]["model"], content


def local_backend(default_url: str, **fields: Any) -> dict[str, Any]:
    return {
        "url": default_url,
        "models": [LOCAL_MODEL],
        "aliases": ["reasoning"],
        "role": "reasoning",
        "timeouts": {"first_byte_s": 2},
        **fields,
    }


def provider(default_url: str, **fields: Any) -> dict[str, Any]:
    return {
        "kind": "openai",
        "base_url": default_url,
        "api_key_env": "CLOUD_KEY",
        "model": CLOUD_MODEL,
        **fields,
    }


@asynccontextmanager
async def world(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    *,
    entries: list[str],
    backend: dict[str, Any] | None = None,
    cloud: dict[str, Any] | None = None,
    chain: dict[str, Any] | None = None,
    runtime: Runtime | None = None,
    key: str = KEY,
    more_providers: tuple[str, ...] = (),
    more_backends: tuple[str, ...] = (),
    **fields: Any,
) -> AsyncIterator[World]:
    """A local backend `reasoning` (role and alias `reasoning`) on a fake vLLM, a provider
    `cloud` on a fake provider, and the chain `reasoning` over `entries`. `more_providers`
    are more providers on the same fake; `more_backends` more backends (no chain) on the
    same fake vLLM, serving `<name>-model` (alias `<name>`)."""
    monkeypatch.setenv("CLOUD_KEY", key)
    async with (
        fake_vllm(
            models=[LOCAL_MODEL, *(f"{name}-model" for name in more_backends)],
            max_tokens=4,
            max_model_len=64,
        ) as local,
        fake_openai_provider(KEY, model=CLOUD_MODEL, max_tokens=3) as fake_cloud,
    ):
        backends = {"reasoning": local_backend(local.url, **(backend or {}))}
        for name in more_backends:
            backends[name] = {"url": local.url, "models": [f"{name}-model"], "aliases": [name]}
        providers = {"cloud": provider(fake_cloud.base_url, **(cloud or {}))}
        for name in more_providers:
            providers[name] = provider(fake_cloud.base_url)
        settings = cloud_settings(
            backends,
            providers,
            {"reasoning": {"entries": entries, **(chain or {})}},
            state_dir=tmp_path / "var",
            **fields,
        )
        seams = None
        if runtime is not None:

            def runtime_for(name: str, config: BackendConfig) -> Runtime:
                assert runtime is not None
                return runtime

            seams = Seams(runtime_factory=runtime_for)
        async with gateway(settings, seams=seams) as gw:
            yield World(gw, local, fake_cloud)


STREAMS = [pytest.param(False, id="json"), pytest.param(True, id="stream")]


# --- the local backend fails: the provider answers ------------------------------------


@dataclass(frozen=True)
class LocalCase:
    reason: str
    backend: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    block: BlockKind | None = None


LAZY = {
    "runtime": {"kind": "process", "command": ["unused"]},
    "lifecycle": "lazy",
    "vram_mib": 1000,
}
LOCAL_CASES = [
    pytest.param(LocalCase("connect", {"url": f"http://127.0.0.1:{free_port()}"}), id="connect"),
    pytest.param(LocalCase("http_5xx", faults={"fail_status": 500, "fail_count": 1}), id="500"),
    pytest.param(LocalCase("http_5xx", faults={"fail_status": 502, "fail_count": 1}), id="502"),
    pytest.param(LocalCase("unavailable", faults={"fail_status": 503, "fail_count": 1}), id="503"),
    pytest.param(LocalCase("rate_limited", faults={"fail_status": 429, "fail_count": 1}), id="429"),
    pytest.param(
        LocalCase("timeout", {"timeouts": {"first_byte_s": 0.3}}, {"stall_before_headers": True}),
        id="first-byte-timeout",
    ),
    pytest.param(LocalCase("local_blocked", block=BlockKind.BLOCKED), id="blocked-by-zone"),
    pytest.param(LocalCase("local_yielded", block=BlockKind.YIELDED), id="yielded"),
    pytest.param(LocalCase("local_disabled", block=BlockKind.DISABLED), id="disabled"),
]


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("case", LOCAL_CASES)
async def test_a_failing_local_backend_falls_back_to_the_provider(
    case: LocalCase, stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(
        monkeypatch, tmp_path, entries=["reasoning", "cloud"], backend=case.backend
    ) as w:
        if case.faults:
            await w.local.set_faults(**case.faults)
        if case.block is not None:
            w.services.backends["reasoning"].block("test", "a test", kind=case.block)
        response = await ask(w.gw, stream=stream)
        assert answer(response, stream)[0] == CLOUD_MODEL
        assert response.headers["x-microscheduler-route"] == "cloud"
        assert response.headers["x-microscheduler-fallbacks"] == f"1; reasoning={case.reason}"
        assert w.cloud.calls == 1
        sent = w.cloud.headers_seen[0]
        assert "x-request-id" not in sent  # client headers stay here
        assert (await w.cloud.stats())["requests"][-1]["body"]["model"] == CLOUD_MODEL


@pytest.mark.parametrize("stream", STREAMS)
async def test_a_local_backend_too_slow_to_wake_falls_back_and_keeps_starting(
    stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runtime = FakeVllmRuntime(free_port(), open_at_start=False, models=[LOCAL_MODEL])
    backend = {**LAZY, "url": f"http://127.0.0.1:{runtime.port}"}
    async with world(
        monkeypatch,
        tmp_path,
        entries=["reasoning", "cloud"],
        backend=backend,
        chain={"wake_timeout_s": 0.2},
        runtime=runtime,
    ) as w:
        response = await ask(w.gw, stream=stream)
        assert answer(response, stream)[0] == CLOUD_MODEL
        assert response.headers["x-microscheduler-fallbacks"] == "1; reasoning=local_wake_timeout"
        assert runtime.starts == 1  # the start goes on for later requests
        # The chain's impatience is not the backend's failure: its circuit stays closed.
        circuit = w.services.plane.cloud.status().circuits["reasoning"]
        assert (circuit.state, circuit.consecutive_failures) == ("closed", 0)
        runtime.listening.set()
        await w.services.backends["reasoning"].start()
        response = await ask(w.gw, stream=stream)
        assert answer(response, stream)[0] == LOCAL_MODEL
        assert response.headers["x-microscheduler-fallbacks"] == "0"


@pytest.mark.parametrize("stream", STREAMS)
async def test_a_local_backend_that_fails_to_start_falls_back(
    stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    runtime.start_error = RuntimeFailure("the runtime refused")
    backend = {**LAZY, "url": f"http://127.0.0.1:{free_port()}"}
    async with world(
        monkeypatch, tmp_path, entries=["reasoning", "cloud"], backend=backend, runtime=runtime
    ) as w:
        response = await ask(w.gw, stream=stream)
        assert answer(response, stream)[0] == CLOUD_MODEL
        assert response.headers["x-microscheduler-fallbacks"] == "1; reasoning=local_failed"


@pytest.mark.parametrize("stream", STREAMS)
async def test_context_length_is_relayed_unless_the_chain_says_next(
    stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    long = "word " * 200  # more than the local max_model_len of 64 tokens
    async with world(monkeypatch, tmp_path, entries=["reasoning", "cloud"]) as w:
        response = await ask(w.gw, stream=stream, messages=[{"role": "user", "content": long}])
        assert response.status_code == 400
        assert "maximum context length" in response.json()["error"]["message"]
        assert response.headers["x-microscheduler-route"] == "reasoning"
        assert w.cloud.calls == 0
    async with world(
        monkeypatch,
        tmp_path,
        entries=["reasoning", "cloud"],
        chain={"on_context_length": "next"},
    ) as w:
        response = await ask(w.gw, stream=stream, messages=[{"role": "user", "content": long}])
        assert answer(response, stream)[0] == CLOUD_MODEL
        assert response.headers["x-microscheduler-fallbacks"] == "1; reasoning=context_length"


@pytest.mark.parametrize("stream", STREAMS)
async def test_a_local_client_error_is_relayed_and_nothing_else_is_asked(
    stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, entries=["reasoning", "cloud"]) as w:
        response = await ask(w.gw, stream=stream, n=2)
        assert response.status_code == 400
        assert "n > 1" in response.json()["error"]["message"]
        assert w.cloud.calls == 0


# --- the provider fails: the local backend answers --------------------------------------


@dataclass(frozen=True)
class ProviderCase:
    reason: str
    status: int | None = None
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    cloud: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    key: str = KEY
    retry_in: float | None = None  # the circuit's cooldown it should cause


def _error(code: str, message: str = "no") -> dict[str, Any]:
    return {"error": {"message": message, "type": "x", "param": None, "code": code}}


PROVIDER_CASES = [
    pytest.param(ProviderCase("auth_misconfigured", key="sk-wrong-key", retry_in=300), id="401"),
    pytest.param(
        ProviderCase("auth_misconfigured", 403, _error("forbidden"), retry_in=300), id="403"
    ),
    pytest.param(
        ProviderCase("rate_limited", 429, _error("rate_limit"), {"retry-after": "7"}, retry_in=7),
        id="429-retry-after",
    ),
    pytest.param(
        ProviderCase("quota_exhausted", 429, _error("insufficient_quota"), retry_in=300),
        id="429-quota",
    ),
    pytest.param(ProviderCase("overloaded", 529, _error("overloaded")), id="529"),
    pytest.param(ProviderCase("http_5xx", 500, _error("oops")), id="500"),
    pytest.param(
        ProviderCase("unavailable", 503, b"<html>busy</html>", {"retry-after": "12"}, retry_in=12),
        id="503-retry-after",
    ),
    pytest.param(
        ProviderCase("connect", cloud={"base_url": f"http://127.0.0.1:{free_port()}/v1"}),
        id="connect",
    ),
    pytest.param(
        ProviderCase(
            "timeout", cloud={"first_byte_timeout_s": 0.3}, faults={"stall_before_headers": True}
        ),
        id="first-byte-timeout",
    ),
]


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("case", PROVIDER_CASES)
async def test_a_failing_provider_falls_back_to_the_next_entry(
    case: ProviderCase, stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(
        monkeypatch, tmp_path, entries=["cloud", "reasoning"], cloud=case.cloud, key=case.key
    ) as w:
        if case.status is not None:
            w.cloud.inject(case.status, case.body, headers=case.headers)
        if case.faults:
            await w.cloud.set_faults(**case.faults)
        response = await ask(w.gw, stream=stream)
        assert answer(response, stream)[0] == LOCAL_MODEL
        assert response.headers["x-microscheduler-route"] == "reasoning"
        assert response.headers["x-microscheduler-fallbacks"] == f"1; cloud={case.reason}"
        assert "set-cookie" not in response.headers
        circuit = w.services.plane.cloud.status().circuits["cloud"]
        if case.retry_in is not None:
            assert circuit.state == "open"
            assert case.retry_in - 2 < circuit.retry_in_s <= case.retry_in
        else:
            assert (circuit.state, circuit.consecutive_failures) == ("closed", 1)
        sample = w.gw.registry.get_sample_value(
            "microscheduler_provider_requests_total",
            {"provider": "cloud", "outcome": case.reason},
        )
        assert sample == 1


async def test_an_error_as_the_first_event_of_a_stream_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, entries=["cloud", "reasoning"]) as w:
        body = b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n'
        w.cloud.inject(200, body + b"data: [DONE]\n\n", content_type="text/event-stream")
        response = await ask(w.gw, stream=True)
        assert answer(response, True)[0] == LOCAL_MODEL
        assert response.headers["x-microscheduler-fallbacks"] == "1; cloud=stream_error"


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize(
    ("status", "code"),
    [(400, "invalid_value"), (404, "not_found"), (413, "too_large"), (422, "unprocessable")],
)
async def test_provider_client_errors_are_relayed_and_never_retried_elsewhere(
    status: int, code: str, stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, entries=["cloud", "reasoning"]) as w:
        w.cloud.inject(
            status, _error(code, "you sent something wrong"), headers={"set-cookie": "a=b"}
        )
        response = await ask(w.gw, stream=stream)
        assert response.status_code == status
        assert response.json()["error"]["code"] == code
        assert response.headers["x-microscheduler-route"] == "cloud"
        assert response.headers["x-microscheduler-fallbacks"] == "0"
        assert "set-cookie" not in response.headers  # a provider's cookies stay there
        assert (await w.local.stats())["requests"] == []
        circuit = w.services.plane.cloud.status().circuits["cloud"]
        assert (circuit.state, circuit.consecutive_failures) == ("closed", 0)


@pytest.mark.parametrize("stream", STREAMS)
async def test_a_rate_limit_is_relayed_when_the_chain_does_not_list_429(
    stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(
        monkeypatch, tmp_path, entries=["cloud", "reasoning"], chain={"fallback_on_status": [500]}
    ) as w:
        w.cloud.inject(429, _error("rate_limit"), headers={"retry-after": "3"})
        response = await ask(w.gw, stream=stream)
        assert response.status_code == 429
        assert response.headers["retry-after"] == "3"
        assert (await w.local.stats())["requests"] == []


async def test_provider_gets_its_model_its_key_and_no_client_headers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(
        monkeypatch, tmp_path, entries=["cloud"], cloud={"headers": {"X-Org": "acme"}}
    ) as w:
        response = await w.gw.client.post(
            "/v1/chat/completions",
            json={"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]},
            headers={"cookie": "secret=1", "x-custom": "mine", "authorization": "Bearer client"},
        )
        assert response.status_code == 200
        assert w.cloud.unauthorized == 0  # the provider's key, not the client's
        sent = w.cloud.headers_seen[0]
        assert sent["x-org"] == "acme"
        assert "cookie" not in sent
        assert "x-custom" not in sent
        assert (await w.cloud.stats())["requests"][-1]["body"]["model"] == CLOUD_MODEL


async def test_embeddings_and_completions_follow_the_chain_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, entries=["reasoning", "cloud"]) as w:
        w.services.backends["reasoning"].block("test", "a test", kind=BlockKind.YIELDED)
        embedding = await w.gw.client.post(
            "/v1/embeddings", json={"model": "reasoning", "input": "hello"}
        )
        assert embedding.status_code == 200
        assert embedding.headers["x-microscheduler-route"] == "cloud"
        completion = await w.gw.client.post(
            "/v1/completions", json={"model": "reasoning", "prompt": "once", "max_tokens": 2}
        )
        assert completion.status_code == 200
        assert completion.json()["model"] == CLOUD_MODEL


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize(
    ("fields", "reason", "chain"),
    [
        # A full queue falls back only when the chain opts in (test_chain_queue_full.py).
        pytest.param(
            {"max_waiting": 0}, "local_queue_full", {"fallback_on": ["queue_full"]},
            id="queue-full",
        ),
        pytest.param({"vram_mib": 40000}, "local_no_vram", {}, id="no-vram"),  # > the 32 GiB GPU
    ],
)  # fmt: skip
async def test_local_admission_refusals_fall_back(
    fields: dict[str, Any],
    reason: str,
    chain: dict[str, Any],
    stream: bool,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    runtime = FakeVllmRuntime(free_port(), open_at_start=False, models=[LOCAL_MODEL])
    backend = {**LAZY, "url": f"http://127.0.0.1:{runtime.port}", **fields}
    async with world(
        monkeypatch, tmp_path, entries=["reasoning", "cloud"], backend=backend, runtime=runtime,
        chain=chain, gpu={"probe": "sim"},  # the simulated 32 GiB GPU admits
    ) as w:  # fmt: skip
        response = await ask(w.gw, stream=stream)
        assert answer(response, stream)[0] == CLOUD_MODEL
        assert response.headers["x-microscheduler-fallbacks"] == f"1; reasoning={reason}"
        circuit = w.services.plane.cloud.status().circuits["reasoning"]
        assert circuit.consecutive_failures == 0  # a healthy system's refusal is no failure
