"""The first-byte rule: fall back freely before the first content byte, never after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.api.test_fallback_triggers import LAZY, LOCAL_MODEL, ask, events, world
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime


def in_band_error(text: str) -> dict[str, object]:
    found = [e for e in text.split("\n\n") if e and not e.startswith(":")]
    assert found[-1] == "data: [DONE]"
    last = json.loads(found[-2].removeprefix("data: "))
    error: dict[str, object] = last["error"]
    return error


async def test_a_local_stream_cut_after_content_ends_in_band_and_asks_no_one_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, entries=["reasoning", "cloud"]) as w:
        await w.local.set_faults(drop_after=3)  # the role chunk and two tokens
        response = await ask(w.gw, stream=True)
        assert response.status_code == 200
        assert response.headers["x-microscheduler-route"] == "reasoning"
        found = events(response)
        assert json.loads(found[1].removeprefix("data: "))["choices"][0]["delta"]["content"]
        assert in_band_error(response.text)["type"] == "server_error"
        assert w.cloud.calls == 0  # never switch providers mid-stream
        circuit = w.services.plane.cloud.status().circuits["reasoning"]
        assert (circuit.consecutive_failures, circuit.last_reason) == (1, "stream_error")


async def test_a_local_stream_stalling_after_content_ends_in_band_and_asks_no_one_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(
        monkeypatch, tmp_path, entries=["reasoning", "cloud"], backend={"timeouts": {"idle_s": 0.3}}
    ) as w:
        await w.local.set_faults(stall_after=2)
        response = await ask(w.gw, stream=True)
        assert response.status_code == 200
        assert in_band_error(response.text)["code"] == "upstream_timeout"
        assert w.cloud.calls == 0


async def test_a_provider_stream_cut_after_content_ends_in_band_and_asks_no_one_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, entries=["cloud", "reasoning"]) as w:
        await w.cloud.set_faults(drop_after=2)
        response = await ask(w.gw, stream=True)
        assert response.status_code == 200
        assert response.headers["x-microscheduler-route"] == "cloud"
        in_band_error(response.text)
        assert (await w.local.stats())["requests"] == []
        sample = w.gw.registry.get_sample_value(
            "microscheduler_provider_requests_total",
            {"provider": "cloud", "outcome": "stream_error"},
        )
        assert sample == 1


async def test_a_stall_before_the_first_byte_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(
        monkeypatch, tmp_path, entries=["cloud", "reasoning"], cloud={"first_byte_timeout_s": 0.3}
    ) as w:
        await w.cloud.set_faults(ttft=5)  # headers at once, no content for 5 s
        response = await ask(w.gw, stream=False)
        assert response.status_code == 200
        assert response.json()["model"] == LOCAL_MODEL
        assert response.headers["x-microscheduler-fallbacks"] == "1; cloud=timeout"


async def test_wake_notices_carry_no_content_so_the_chain_can_still_fall_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runtime = FakeVllmRuntime(free_port(), open_at_start=False, models=[LOCAL_MODEL])
    async with world(
        monkeypatch,
        tmp_path,
        entries=["reasoning", "cloud"],
        backend={**LAZY, "url": f"http://127.0.0.1:{runtime.port}"},
        chain={"wake_timeout_s": 0.45},
        runtime=runtime,
        wake_notice_s=0.1,
    ) as w:
        response = await ask(w.gw, stream=True)
        assert response.status_code == 200
        assert "x-microscheduler-route" not in response.headers  # the status line went first
        blocks = response.text.split("\n\n")
        assert blocks[0].startswith(": waking reasoning ")
        route = next(b for b in blocks if b.startswith(": route"))
        assert route == ": route cloud; fallbacks 1; reasoning=local_wake_timeout"
        found = events(response)
        assert found[-1] == "data: [DONE]"
        assert json.loads(found[0].removeprefix("data: "))["model"] == "cloud-model"


async def test_after_wake_notices_a_failed_chain_ends_in_band(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runtime = FakeVllmRuntime(free_port(), open_at_start=False, models=[LOCAL_MODEL])
    async with world(
        monkeypatch,
        tmp_path,
        entries=["reasoning", "cloud"],
        backend={**LAZY, "url": f"http://127.0.0.1:{runtime.port}"},
        chain={"wake_timeout_s": 0.3},
        runtime=runtime,
        wake_notice_s=0.1,
    ) as w:
        w.cloud.inject(503, {"error": {"message": "down"}})
        response = await ask(w.gw, stream=True)
        assert response.status_code == 200
        error = in_band_error(response.text)
        assert error["code"] == "fallback_exhausted"
        assert error["tried"] == [
            {"entry": "reasoning", "reason": "local_wake_timeout"},
            {"entry": "cloud", "reason": "unavailable"},
        ]
