"""The fake vLLM server: vLLM shapes, faults, stats, disconnects, sleep mode, process life."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.gpu.ledger import ledger_entries, read_ledger
from app.sim.vllm import FakeConfig, FakeVllmServer, parse_args
from app.sim.vram import asleep_mib
from tests.fakes.waits import until

MODELS = ["m1", "m2"]
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "alpha beta gamma"}]}

ServerFactory = Callable[..., Awaitable[FakeVllmServer]]


@pytest.fixture
async def make_server() -> AsyncIterator[ServerFactory]:
    async with contextlib.AsyncExitStack() as stack:

        async def make(**options: Any) -> FakeVllmServer:
            config = FakeConfig(port=0, models=MODELS, **options)
            return await stack.enter_async_context(FakeVllmServer(config))

        yield make


@pytest.fixture
async def server(make_server: ServerFactory) -> FakeVllmServer:
    return await make_server()


@pytest.fixture
async def client(server: FakeVllmServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as c:
        yield c


async def stats(client: httpx.AsyncClient) -> dict[str, Any]:
    resp = await client.get("/_fake/stats")
    assert resp.status_code == 200
    data: dict[str, Any] = resp.json()
    return data


async def stat_is(client: httpx.AsyncClient, key: str, value: int) -> None:
    async def check() -> bool:
        current: int = (await stats(client))[key]
        return current == value

    await until(check)


async def metric(client: httpx.AsyncClient, name: str, **labels: str) -> float:
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"metric {name} {labels} not found")


async def read_events(
    resp: httpx.Response, limit: int | None = None, into: list[str] | None = None
) -> list[str]:
    """SSE ``data:`` payloads (appended to ``into`` as they arrive, if given)."""
    events: list[str] = [] if into is None else into
    async for line in resp.aiter_lines():
        if line.startswith("data: "):
            events.append(line.removeprefix("data: "))
            if limit is not None and len(events) >= limit:
                break
    return events


async def stream_into(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], into: list[str]
) -> None:
    async with client.stream("POST", path, json=body) as resp:
        await read_events(resp, into=into)


# --- shapes -----------------------------------------------------------------------------------


async def test_health_version_and_models(client: httpx.AsyncClient) -> None:
    health = await client.get("/health")
    assert (health.status_code, health.content) == (200, b"")
    assert (await client.get("/version")).json() == {"version": "0.0.0-fake"}
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    assert [card["id"] for card in models["data"]] == MODELS
    card = models["data"][0]
    assert card["object"] == "model"
    assert card["owned_by"] == "vllm"
    assert card["root"] == "m1"
    assert card["parent"] is None
    assert card["max_model_len"] == 8192
    assert card["permission"][0]["object"] == "model_permission"
    assert (await client.get("/nope")).json() == {"detail": "Not Found"}


async def test_chat_completion(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
    assert resp.status_code == 200
    body = resp.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert body["model"] == "m1"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "alpha beta gamma alpha"
    assert (choice["finish_reason"], choice["stop_reason"], choice["logprobs"]) == (
        "length",
        None,
        None,
    )
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": None,
    }


async def test_default_length_finishes_with_stop(make_server: ServerFactory) -> None:
    server = await make_server(max_tokens=3)
    async with httpx.AsyncClient(base_url=server.url) as client:
        body = (await client.post("/v1/completions", json={"prompt": "x y"})).json()
    assert body["id"].startswith("cmpl-")
    assert body["object"] == "text_completion"
    assert body["model"] == "m1"  # no "model": vLLM uses the served model
    assert body["choices"][0]["text"] == "x y x"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 3


async def test_chat_stream_events_arrive_one_by_one(make_server: ServerFactory) -> None:
    server = await make_server(tokens_per_second=50)
    request = {**CHAT, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    arrivals: list[float] = []
    events: list[str] = []
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=5) as client,
        client.stream("POST", "/v1/chat/completions", json=request) as resp,
    ):
        assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                arrivals.append(time.monotonic())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 7  # role + 5 tokens + usage
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"]["content"] for c in chunks[1:6]]
    assert "".join(contents) == "alpha beta gamma alpha beta"
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:6]] == [None] * 4 + ["length"]
    assert chunks[6]["choices"] == []
    assert chunks[6]["usage"] == {"prompt_tokens": 3, "total_tokens": 8, "completion_tokens": 5}
    # 20 ms between tokens: the token events were flushed separately, not in one burst
    assert arrivals[5] - arrivals[1] >= 0.06


async def test_completion_stream_with_continuous_usage(client: httpx.AsyncClient) -> None:
    request = {
        "model": "m2",
        "prompt": "one two",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    async with client.stream("POST", "/v1/completions", json=request) as resp:
        events = await read_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:3]] == ["one", " two", " one"]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 3]
    assert chunks[2]["choices"][0]["finish_reason"] == "length"
    assert chunks[3]["choices"] == []
    assert chunks[0]["model"] == "m2"


async def test_embeddings(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/embeddings", json={"model": "m1", "input": ["a b", "c", "a b"]})
    body = resp.json()
    assert body["object"] == "list"
    assert body["id"].startswith("embd-")
    vectors = [d["embedding"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 8 for d in body["data"])
    assert vectors[0] == vectors[2] != vectors[1]
    assert abs(sum(v * v for v in vectors[0]) - 1.0) < 1e-9
    assert body["usage"]["prompt_tokens"] == 5  # words per input: 2 + 1 + 2
    single = await client.post("/v1/embeddings", json={"input": [1, 2, 3, 4]})
    assert single.json()["usage"]["prompt_tokens"] == 4
    b64 = await client.post("/v1/embeddings", json={"input": "a", "encoding_format": "base64"})
    assert isinstance(b64.json()["data"][0]["embedding"], str)


async def test_errors_use_vllm_body(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/chat/completions", json={**CHAT, "model": "x"})
    assert resp.status_code == 404
    assert resp.json() == {
        "error": {
            "message": "The model `x` does not exist. Valid aliases: m1, m2.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    bad = await client.post("/v1/completions", content=b"{not json")
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == 400
    assert "json_invalid" in bad.json()["error"]["message"]
    for path in ("/v1/chat/completions", "/v1/embeddings"):
        missing = await client.post(path, json={"model": "m1"})
        assert missing.status_code == 400
    too_long = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10**6})
    assert too_long.status_code == 400
    assert too_long.json()["error"]["param"] == "max_tokens"


async def test_metrics(make_server: ServerFactory) -> None:
    server = await make_server(max_num_seqs=2, tokens_per_second=20)
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        resp = await client.get("/metrics")
        assert resp.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:request_success_total",
        ):
            assert f'{name}{{engine="0",' in resp.text
        await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
        assert await metric(client, "vllm:prompt_tokens_total", model_name="m1") == 3
        assert await metric(client, "vllm:generation_tokens_total") == 2
        assert await metric(client, "vllm:request_success_total", finished_reason="length") == 1
        # three long requests with room for two: two run, one waits
        body = {**CHAT, "max_tokens": 200}
        tasks = [
            asyncio.create_task(client.post("/v1/chat/completions", json=body)) for _ in range(3)
        ]

        async def saturated() -> bool:
            return await metric(client, "vllm:num_requests_waiting") == 1

        await until(saturated)
        assert await metric(client, "vllm:num_requests_running") == 2
        assert await metric(client, "vllm:kv_cache_usage_perc") == 1.0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await stat_is(client, "in_flight", 0)
        assert await metric(client, "vllm:num_requests_waiting") == 0


# --- faults -----------------------------------------------------------------------------------


async def test_fail_status_with_count(make_server: ServerFactory) -> None:
    server = await make_server(fail_status=503, fail_count=2)
    async with httpx.AsyncClient(base_url=server.url) as client:
        codes = [
            (await client.post("/v1/chat/completions", json=CHAT)).status_code for _ in range(3)
        ]
        assert codes == [503, 503, 200]
        assert (await client.post("/v1/embeddings", json={"input": "a"})).status_code == 200
        assert (await stats(client))["failed"] == 2


async def test_failure_body(make_server: ServerFactory) -> None:
    server = await make_server(fail_status=500)
    async with httpx.AsyncClient(base_url=server.url) as client:
        for _ in range(2):  # unlimited without fail_count
            resp = await client.post("/v1/embeddings", json={"input": "a"})
            assert resp.status_code == 500
            assert resp.json()["error"]["type"] == "InternalServerError"
            assert resp.json()["error"]["code"] == 500


async def test_drop_after_closes_connection(make_server: ServerFactory) -> None:
    server = await make_server(drop_after=3)
    received: list[str] = []
    request = {**CHAT, "max_tokens": 10, "stream": True}
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await stream_into(client, "/v1/chat/completions", request, received)
        assert len(received) == 3
        assert "[DONE]" not in received[-1]
        await stat_is(client, "dropped", 1)
        assert (await stats(client))["aborted"] == 0


async def test_stall_after_keeps_connection_open(make_server: ServerFactory) -> None:
    server = await make_server(stall_after=2)
    timeout = httpx.Timeout(5, read=0.5)
    async with httpx.AsyncClient(base_url=server.url, timeout=timeout) as client:
        request = {**CHAT, "max_tokens": 10, "stream": True}
        received: list[str] = []
        with pytest.raises(httpx.ReadTimeout):
            await stream_into(client, "/v1/chat/completions", request, received)
        assert len(received) == 2
        await stat_is(client, "aborted", 1)  # the client gave up: an abort, as in vLLM


async def test_stall_before_headers(make_server: ServerFactory) -> None:
    server = await make_server(stall_before_headers=True)
    async with httpx.AsyncClient(base_url=server.url, timeout=httpx.Timeout(5, read=0.2)) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/v1/completions", json={"prompt": "a"})
        await stat_is(c, "aborted", 1)
        assert (await stats(c))["in_flight"] == 0


async def test_runtime_fault_endpoint(client: httpx.AsyncClient) -> None:
    current = (
        await client.post("/_fake/faults", json={"fail_status": 429, "fail_count": 1})
    ).json()
    assert current["fail_status"] == 429
    assert current["fail_count"] == 1
    assert (await client.post("/v1/completions", json={"prompt": "a"})).status_code == 429
    assert (await client.post("/v1/completions", json={"prompt": "a"})).status_code == 200
    assert (await client.get("/_fake/faults")).json()["fail_status"] is None
    # drop_after set at runtime applies to the next stream; null clears it
    await client.post("/_fake/faults", json={"drop_after": 1, "ttft": 0.01})
    received: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        await stream_into(client, "/v1/completions", {"prompt": "a", "stream": True}, received)
    assert len(received) == 1
    cleared = (await client.post("/_fake/faults", json={"drop_after": None, "ttft": None})).json()
    assert (cleared["drop_after"], cleared["ttft"]) == (None, 0.0)
    await client.post("/_fake/faults", json={"health_status": 503})
    assert (await client.get("/health")).status_code == 503
    assert (await client.post("/_fake/faults", json={"bogus": 1})).status_code == 400
    assert (await client.post("/_fake/faults", json={"ttft": -1})).status_code == 400


async def test_stats_records_requests(client: httpx.AsyncClient) -> None:
    await client.post("/v1/chat/completions", json=CHAT, headers={"X-Trace-Me": "yes"})
    await client.post("/v1/completions", content=b"garbage")
    await client.get("/health")  # health probes and metrics scrapes are not recorded
    data = await stats(client)
    first, second = data["requests"]
    assert (first["method"], first["path"], first["body"]) == ("POST", "/v1/chat/completions", CHAT)
    assert first["headers"]["x-trace-me"] == "yes"
    assert second["body"] is None
    assert (data["completed"], data["aborted"], data["in_flight"]) == (1, 0, 0)
    reset = (await client.delete("/_fake/stats")).json()
    assert (reset["requests"], reset["completed"]) == ([], 0)


# --- client disconnects -----------------------------------------------------------------------


async def test_disconnect_mid_stream_is_an_abort(make_server: ServerFactory) -> None:
    server = await make_server(tokens_per_second=50)
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        request = {**CHAT, "max_tokens": 500, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=request) as resp:
            assert len(await read_events(resp, limit=3)) == 3
        await stat_is(client, "aborted", 1)
        assert (await stats(client))["in_flight"] == 0
        assert await metric(client, "vllm:request_success_total", finished_reason="abort") == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_during_ttft_is_an_abort(make_server: ServerFactory, stream: bool) -> None:
    server = await make_server(ttft=30)
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        body = {**CHAT, "stream": stream}
        task = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await stat_is(client, "in_flight", 1)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await stat_is(client, "aborted", 1)
        assert (await stats(client))["in_flight"] == 0
        assert await metric(client, "vllm:request_success_total", finished_reason="abort") == 1


# --- sleep mode -------------------------------------------------------------------------------


async def test_sleep_endpoints_need_dev_mode(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    server = await make_server()
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.post("/sleep", params={"level": 1})).status_code == 404
        assert (await client.post("/wake_up")).status_code == 404
        assert (await client.get("/is_sleeping")).status_code == 404


async def test_sleep_queues_requests_until_wake_up(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    server = await make_server()
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
        resp = await client.post("/sleep", params={"level": 1})
        assert (resp.status_code, resp.json()) == (200, {"status": "sleeping", "level": 1})
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
        state = "weights_offloaded"
        assert await metric(client, "vllm:engine_sleep_state", sleep_state=state) == 1
        task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
        await stat_is(client, "waiting", 1)
        assert not task.done()
        woken = await client.post("/wake_up")
        assert (woken.status_code, woken.json()) == (200, {"status": "awake", "tags": None})
        assert (await task).status_code == 200
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
        assert (await client.post("/sleep", params={"level": 7})).status_code == 400


async def test_sleep_aborts_running_stream(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    server = await make_server(tokens_per_second=50)
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        request = {**CHAT, "max_tokens": 500, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=request) as resp:
            lines = resp.aiter_lines()
            assert (await anext(lines)).startswith("data: ")
            await client.post("/sleep", params={"level": 2})
            events = [line.removeprefix("data: ") async for line in lines if line]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
        assert await metric(client, "vllm:engine_sleep_state", sleep_state="discard_all") == 1


# --- the process ------------------------------------------------------------------------------


def test_cli_flags() -> None:
    config = parse_args(["--model", "a", "b", "--model", "c", "--fail-status", "503"])
    assert config.models == ["a", "b", "c"]
    assert (config.fail_status, config.fail_count, config.port) == (503, None, 8000)
    with pytest.raises(SystemExit):
        parse_args(["--fail-count", "2"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.sim.vllm", *args,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _wait_log(proc: asyncio.subprocess.Process, needle: str) -> None:
    assert proc.stderr is not None
    async with asyncio.timeout(10):
        while needle not in (await proc.stderr.readline()).decode():
            assert proc.returncode is None


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_process_startup_delay_then_sigterm() -> None:
    port = _free_port()
    proc = await _spawn("--port", str(port), "--model", "m1", "--startup-delay", "0.5")
    try:
        await _wait_log(proc, "loading")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=2) as client:
            with pytest.raises(httpx.ConnectError):  # like vLLM while loading: refused
                await client.get("/health")
            await _wait_log(proc, "listening")
            assert (await client.get("/health")).status_code == 200
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(5):
            assert await proc.wait() == 0
    finally:
        await _kill(proc)


async def test_process_ignore_sigterm() -> None:
    port = _free_port()
    proc = await _spawn("--port", str(port), "--ignore-sigterm")
    try:
        await _wait_log(proc, "listening")
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await proc.wait()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=2) as client:
            assert (await client.get("/health")).status_code == 200
        proc.kill()
        assert await proc.wait() == -signal.SIGKILL
    finally:
        await _kill(proc)


# --- GPU footprint reported to the simulated GPU's ledger ---------------------------------------


def _ledger(directory: Path) -> dict[int, int]:
    return read_ledger(directory, now=time.time())


async def _ledger_is(directory: Path, expected: dict[int, int]) -> None:
    async def check() -> bool:
        return _ledger(directory) == expected

    await until(check)
    assert _ledger(directory) == expected


def test_cli_vram_flags() -> None:
    default = parse_args([])
    assert default.vram_mib == 0
    assert (default.vram_asleep_mib, default.sim_gpu_dir, default.gpus) == (None, None, [0])
    gpu_flags = ["--gpu", "1,2", "--gpu", "3", "--gpu", "1"]
    config = parse_args(["--vram-mib", "8000", "--sim-gpu-dir", "/tmp/l", *gpu_flags])
    assert (config.vram_mib, config.sim_gpu_dir, config.gpus) == (8000, "/tmp/l", [1, 2, 3])
    assert asleep_mib(config) == 1000  # default: one eighth
    assert asleep_mib(parse_args(["--vram-mib", "8000", "--vram-asleep-mib", "0"])) == 0
    for bad in (
        ["--vram-mib", "800", "--vram-asleep-mib", "900"],
        ["--vram-asleep-mib", "1"],  # more than the default --vram-mib 0
        ["--vram-mib", "-1"],
        ["--gpu", "a"],
        ["--gpu", "0,-1"],
    ):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_the_fake_holds_memory_on_the_gpus_cuda_shows_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_args(["-tp", "2"]).gpus == [0, 1]  # nothing hidden: from 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert parse_args([]).gpus == [1]  # CUDA's device 0 is the first listed
    assert parse_args(["--tensor-parallel-size", "2"]).gpus == [1, 0]
    assert parse_args(["--gpu", "0"]).gpus == [0]
    for bad, said in (
        (["--tensor-parallel-size", "3"], "ValueError: World size (3) is larger than the "
         "number of available GPUs (2) in this node."),  # vllm/config/parallel.py's words
        (["--gpu", "2"], "RuntimeError: --gpu [2] is not visible (CUDA_VISIBLE_DEVICES=1,0)"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            parse_args(bad)
        assert exited.value.code == 1
        assert said in capsys.readouterr().err


async def test_footprint_follows_sleep_state(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    server = await make_server(
        vram_mib=8000, vram_asleep_mib=1500, sim_gpu_dir=str(tmp_path), gpus=[0, 2]
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        assert _ledger(tmp_path) == {0: 8000, 2: 8000}
        data = await stats(client)
        assert (data["vram_mib"], data["vram_gpus"]) == (8000, [0, 2])
        [entry] = ledger_entries(tmp_path, now=time.time())
        assert (entry.pid, entry.model, entry.gpus) == (os.getpid(), "m1", (0, 2))
        [ledger_file] = tmp_path.glob("*.json")
        assert data["vram_ledger_file"] == str(ledger_file)

        assert (await client.post("/sleep", params={"level": 0})).status_code == 200
        assert _ledger(tmp_path) == {0: 8000, 2: 8000}  # level 0 pauses, frees nothing
        await client.post("/wake_up")

        assert (await client.post("/sleep", params={"level": 2})).status_code == 200
        assert _ledger(tmp_path) == {0: 1500, 2: 1500}
        assert (await stats(client))["vram_mib"] == 1500
        await client.post("/wake_up", params={"tags": "weights"})
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
        assert _ledger(tmp_path) == {0: 1500, 2: 1500}  # asleep until every tag is awake
        await client.post("/wake_up", params={"tags": "kv_cache"})
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
        assert _ledger(tmp_path) == {0: 8000, 2: 8000}
    await server.stop()
    assert _ledger(tmp_path) == {}
    assert list(tmp_path.iterdir()) == []


async def test_footprint_needs_a_ledger_dir_and_a_size(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    without_dir = await make_server(vram_mib=4000)
    zero = await make_server(sim_gpu_dir=str(tmp_path))
    async with httpx.AsyncClient(timeout=5) as client:
        data = (await client.get(f"{without_dir.url}/_fake/stats")).json()
        assert (data["vram_mib"], data["vram_ledger_file"]) == (4000, None)
        data = (await client.get(f"{zero.url}/_fake/stats")).json()
        assert (data["vram_mib"], data["vram_ledger_file"]) == (0, None)
    assert list(tmp_path.iterdir()) == []


async def test_process_reports_footprint_through_sleep_wake_and_sigterm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    port = _free_port()
    proc = await _spawn(
        "--port", str(port), "--model", "m1", "--vram-mib", "1000",
        "--sim-gpu-dir", str(tmp_path), "--startup-delay", "0",
    )  # fmt: skip
    try:
        await _wait_log(proc, "listening")
        assert _ledger(tmp_path) == {0: 1000}
        [entry] = ledger_entries(tmp_path, now=time.time())
        assert (entry.pid, entry.port, entry.model, entry.mib) == (proc.pid, port, "m1", 1000)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            assert (await client.post("/sleep", params={"level": 1})).status_code == 200
            assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
            assert _ledger(tmp_path) == {0: 125}  # default: one eighth stays (CUDA context)
            assert (await stats(client))["vram_mib"] == 125
            assert (await client.post("/wake_up")).status_code == 200
            assert (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
            assert _ledger(tmp_path) == {0: 1000}
        [awake] = ledger_entries(tmp_path, now=time.time())

        async def heartbeat_seen() -> bool:  # nothing changes now but the heartbeat
            [later] = ledger_entries(tmp_path, now=time.time())
            return later.updated_at > awake.updated_at and later.mib == 1000

        await until(heartbeat_seen, timeout_s=5)
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(5):
            assert await proc.wait() == 0
        assert _ledger(tmp_path) == {}
        assert list(tmp_path.iterdir()) == []
    finally:
        await _kill(proc)


async def test_process_reports_while_loading(tmp_path: Path) -> None:
    port = _free_port()
    proc = await _spawn(
        "--port", str(port), "--vram-mib", "6000", "--gpu", "1",
        "--sim-gpu-dir", str(tmp_path), "--startup-delay", "30",
    )  # fmt: skip
    try:
        await _wait_log(proc, "loading")
        assert _ledger(tmp_path) == {1: 6000}  # like vLLM: allocated before /health answers
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=2) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get("/health")
        proc.send_signal(signal.SIGTERM)  # stopped while loading: the entry goes too
        async with asyncio.timeout(5):
            assert await proc.wait() == 0
        assert list(tmp_path.iterdir()) == []
    finally:
        await _kill(proc)


async def test_process_sigkilled_leaves_a_file_the_reader_ignores(tmp_path: Path) -> None:
    port = _free_port()
    proc = await _spawn("--port", str(port), "--vram-mib", "2000", "--sim-gpu-dir", str(tmp_path))
    try:
        await _wait_log(proc, "listening")
        await _ledger_is(tmp_path, {0: 2000})
        proc.kill()
        await proc.wait()
        assert len(list(tmp_path.glob("*.json"))) == 1
        assert _ledger(tmp_path) == {}
    finally:
        await _kill(proc)


async def test_text_utf8_cannot_hold_is_echoed_as_an_escape(client: httpx.AsyncClient) -> None:
    # A lone surrogate sent as a JSON escape: vLLM answers; so must the fake, and its stats.
    body = b'{"model": "m1", "messages": [{"role": "user", "content": "\\udcff"}]}'
    response = await client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    stats = await client.get("/_fake/stats")
    assert stats.status_code == 200
    assert "\\udcff" in stats.text
