"""Circuits through the gateway (open, skip, half-open, close; all open gives 503 with
Retry-After), the request budget (one deadline, a cap on attempts, no hidden retries),
the metrics and the events. The chain's clock is moved by the test to age circuits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from app.lifecycle.blocks import BlockKind
from tests.api.test_fallback_triggers import CLOUD_MODEL, LOCAL_MODEL, World, ask, world
from tests.fakes.waits import until

CIRCUIT = {"failure_threshold": 2, "cooldown_s": 10, "backoff": 2}


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@asynccontextmanager
async def clocked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **options: Any
) -> AsyncIterator[tuple[World, Clock]]:
    options.setdefault("entries", ["cloud", "reasoning"])
    async with world(monkeypatch, tmp_path, **options) as w:
        clock = Clock()
        w.services.plane.cloud.clock = clock
        yield w, clock


def gauge(w: World, entry: str) -> float | None:
    return w.gw.registry.get_sample_value("microscheduler_circuit_open", {"entry": entry})


def events_of(w: World, kind: str) -> list[dict[str, Any]]:
    return [e for e in w.services.events.recent() if e["kind"] == kind]


async def test_a_circuit_opens_skips_half_opens_and_closes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with clocked(monkeypatch, tmp_path, circuit=CIRCUIT) as (w, clock):
        assert gauge(w, "cloud") == 0
        w.cloud.inject(500, {"error": {"message": "boom"}}, count=2)
        for _ in range(2):
            response = await ask(w.gw, stream=False)
            assert response.headers["x-microscheduler-fallbacks"] == "1; cloud=http_5xx"
        assert gauge(w, "cloud") == 1
        assert [e["entry"] for e in events_of(w, "circuit_open")] == ["cloud"]

        response = await ask(w.gw, stream=False)  # skipped: not asked at all
        assert response.json()["model"] == LOCAL_MODEL
        assert response.headers["x-microscheduler-fallbacks"] == "1; cloud=circuit_open"
        assert w.cloud.calls == 2

        clock.offset += 11  # past the cooldown: one trial may go
        assert w.services.plane.cloud.status().circuits["cloud"].state == "half_open"
        assert gauge(w, "cloud") == 0
        response = await ask(w.gw, stream=True)
        assert response.headers["x-microscheduler-route"] == "cloud"
        assert w.cloud.calls == 3
        assert w.services.plane.cloud.status().circuits["cloud"].state == "closed"
        assert [e["entry"] for e in events_of(w, "circuit_closed")] == ["cloud"]


async def test_a_failed_trial_opens_the_circuit_again_for_longer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with clocked(monkeypatch, tmp_path, circuit=CIRCUIT) as (w, clock):
        w.cloud.inject(502, {"error": {"message": "boom"}}, count=3)
        for _ in range(2):
            await ask(w.gw, stream=False)
        clock.offset += 11
        response = await ask(w.gw, stream=False)
        assert response.headers["x-microscheduler-fallbacks"] == "1; cloud=http_5xx"
        circuit = w.services.plane.cloud.status().circuits["cloud"]
        assert circuit.state == "open"
        assert 18 < circuit.retry_in_s <= 20  # 10 s doubled after a failed trial


async def test_one_trial_at_a_time_while_half_open(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with clocked(monkeypatch, tmp_path, circuit=CIRCUIT) as (w, clock):
        w.cloud.inject(500, {"error": {"message": "boom"}}, count=2)
        for _ in range(2):
            await ask(w.gw, stream=False)
        clock.offset += 11
        await w.cloud.set_faults(ttft=0.5)  # the trial takes a while
        trial = asyncio.create_task(ask(w.gw, stream=False))
        await until(lambda: w.cloud.calls == 3, what="the trial to reach the provider")
        other = await ask(w.gw, stream=False)
        assert other.headers["x-microscheduler-fallbacks"] == "1; cloud=trial_in_flight"
        assert (await trial).headers["x-microscheduler-route"] == "cloud"
        assert w.cloud.calls == 3


async def test_every_entry_open_gives_503_with_retry_after_and_what_was_tried(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with clocked(monkeypatch, tmp_path, circuit=CIRCUIT) as (w, _clock):
        await w.local.set_faults(fail_status=500)
        w.cloud.inject(500, {"error": {"message": "boom"}}, count=2)
        first = await ask(w.gw, stream=False)
        assert first.status_code == 503
        error = first.json()["error"]
        assert error["code"] == "fallback_exhausted"
        assert error["tried"] == [
            {"entry": "cloud", "reason": "http_5xx"},
            {"entry": "reasoning", "reason": "http_5xx"},
        ]
        assert "retry-after" not in first.headers
        second = await ask(w.gw, stream=False)
        assert second.status_code == 503
        assert second.headers["retry-after"] == "10"  # both circuits opened just now
        calls, local_calls = w.cloud.calls, len((await w.local.stats())["requests"])

        third = await ask(w.gw, stream=True)
        assert third.status_code == 503
        assert third.headers["retry-after"] in ("9", "10")
        error = third.json()["error"]
        assert error["code"] == "all_entries_cooling"
        assert error["type"] == "server_error"
        assert error["tried"] == [
            {"entry": "cloud", "reason": "circuit_open"},
            {"entry": "reasoning", "reason": "circuit_open"},
        ]
        assert "cooling down" in error["message"]
        assert third.headers["x-microscheduler-fallbacks"] == (
            "2; cloud=circuit_open; reasoning=circuit_open"
        )
        assert (w.cloud.calls, len((await w.local.stats())["requests"])) == (calls, local_calls)


async def test_one_deadline_for_the_whole_chain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with clocked(
        monkeypatch,
        tmp_path,
        backend={"timeouts": {"first_byte_s": 10}},
        cloud={"first_byte_timeout_s": 10},
        chain={"deadline_s": 0.6},
    ) as (w, _clock):
        await w.cloud.set_faults(stall_before_headers=True)
        started = time.monotonic()
        response = await ask(w.gw, stream=False)
        assert time.monotonic() - started < 3
        assert response.status_code == 504
        error = response.json()["error"]
        assert error["code"] == "fallback_deadline"
        assert error["tried"] == [
            {"entry": "cloud", "reason": "deadline"},
            {"entry": "reasoning", "reason": "deadline_unreached"},
        ]
        # The deadline cut the wait short: not the provider's failure.
        assert w.services.plane.cloud.status().circuits["cloud"].consecutive_failures == 0
        assert (await w.local.stats())["requests"] == []


async def test_attempts_are_capped_and_never_retried_inside(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(
        monkeypatch,
        tmp_path,
        entries=["cloud", "cloud2", "reasoning"],
        chain={"max_attempts": 2},
        more_providers=("cloud2",),
    ) as w:
        w.cloud.inject(500, {"error": {"message": "boom"}}, count=2)
        response = await ask(w.gw, stream=False)
        assert response.status_code == 503
        assert response.json()["error"]["tried"] == [
            {"entry": "cloud", "reason": "http_5xx"},
            {"entry": "cloud2", "reason": "http_5xx"},
            {"entry": "reasoning", "reason": "max_attempts"},
        ]
        assert w.cloud.calls == 2  # one request per entry: no retries inside the client
        assert (await w.local.stats())["requests"] == []


async def test_local_refusals_are_not_attempts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(
        monkeypatch, tmp_path, entries=["reasoning", "cloud"], chain={"max_attempts": 1}
    ) as w:
        w.services.backends["reasoning"].block("test", "a test", kind=BlockKind.DISABLED)
        response = await ask(w.gw, stream=False)
        assert response.json()["model"] == CLOUD_MODEL


async def test_fallback_provider_and_token_metrics(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, entries=["cloud", "reasoning"]) as w:
        reg = w.gw.registry

        def value(name: str, **labels: str) -> float | None:
            return reg.get_sample_value(name, labels)

        fallback = "microscheduler_fallbacks_total"
        labels = {"chain": "reasoning", "from_entry": "cloud", "to_entry": "reasoning"}
        assert value(fallback, **labels, reason="http_5xx") == 0  # declared from config
        assert value(fallback, **labels, reason="circuit_open") == 0
        assert value("microscheduler_tokens_total", route="cloud", type="prompt") == 0
        assert value("microscheduler_tokens_total", route="reasoning", type="completion") == 0

        w.cloud.inject(500, {"error": {"message": "boom"}})
        await ask(w.gw, stream=False)
        assert value(fallback, **labels, reason="http_5xx") == 1
        events = [e for e in w.services.events.recent() if e["kind"] == "fallback"]
        assert events[-1] == {
            **events[-1],
            "chain": "reasoning",
            "from_entry": "cloud",
            "to_entry": "reasoning",
            "reason": "http_5xx",
        }
        # The local answer: 4 completion tokens from its usage.
        assert value("microscheduler_tokens_total", route="reasoning", type="completion") == 4

        await ask(w.gw, stream=False)  # the provider answers: 3 tokens
        assert value("microscheduler_provider_requests_total", provider="cloud", outcome="ok") == 1
        assert value("microscheduler_tokens_total", route="cloud", type="completion") == 3
        prompt = value("microscheduler_tokens_total", route="cloud", type="prompt")
        assert prompt is not None
        assert prompt > 0

        await ask(w.gw, stream=True)  # a stream without include_usage: not counted
        assert value("microscheduler_tokens_total", route="cloud", type="completion") == 3
        await ask(w.gw, stream=True, stream_options={"include_usage": True})
        assert value("microscheduler_tokens_total", route="cloud", type="completion") == 6
        assert value("microscheduler_provider_requests_total", provider="cloud", outcome="ok") == 3


async def test_a_model_without_a_chain_is_relayed_as_before(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, entries=["cloud"], more_backends=("plain",)) as w:
        w.cloud.inject(500, {"error": {"message": "boom"}}, count=5)
        # `local-model` is the chained backend's id: its role's chain applies to every
        # name of that backend.
        chained = await w.gw.client.post(
            "/v1/chat/completions",
            json={"model": LOCAL_MODEL, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chained.status_code == 503
        assert chained.json()["error"]["code"] == "fallback_exhausted"
        plain = await w.gw.client.post(
            "/v1/chat/completions",
            json={"model": "plain", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert plain.status_code == 200
        assert not any(h.startswith("x-microscheduler") for h in plain.headers)
        assert w.cloud.calls == 1


async def test_repeated_fallbacks_are_coalesced_in_the_events(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with clocked(monkeypatch, tmp_path, entries=["reasoning", "cloud"]) as (w, clock):
        w.services.backends["reasoning"].block("game", "a game", kind=BlockKind.YIELDED)
        for _ in range(3):
            await ask(w.gw, stream=False)
        assert [e["repeats"] for e in events_of(w, "fallback")] == [0]
        clock.offset += 31
        await ask(w.gw, stream=False)
        found = events_of(w, "fallback")
        assert [(e["reason"], e["repeats"]) for e in found] == [
            ("local_yielded", 0),
            ("local_yielded", 2),
        ]
        counted = w.gw.registry.get_sample_value(
            "microscheduler_fallbacks_total",
            {
                "chain": "reasoning",
                "from_entry": "reasoning",
                "to_entry": "cloud",
                "reason": "local_yielded",
            },
        )
        assert counted == 4  # the metric counts every one
