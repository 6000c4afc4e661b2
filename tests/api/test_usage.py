"""The usage ledger through the gateway: `GET /usage` grouped by model, key, route and day,
a client key reading only its own rows, the per-key summary with a cost estimate, writes
batched off the request path (many requests, few commits), and a store that cannot be
written: said in /status and the metrics, the rows kept and written once it can be."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from app.lifecycle.blocks import BlockKind
from app.services import Services
from tests.fakes.provider import cloud_settings, fake_openai_provider
from tests.fakes.servers import Gateway, fake_vllm, gateway
from tests.fakes.state import sqlite_disk_full
from tests.fakes.waits import until

AGENTS, FAMILY = "sk-agents-1f2e", "sk-family-77c1"
KEYS = {"agents": {"key_env": "AGENTS_KEY"}, "family": {"key_env": "FAMILY_KEY"}}
PRICE = {"input": 1.0, "output": 2.0}


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTS_KEY", AGENTS)
    monkeypatch.setenv("FAMILY_KEY", FAMILY)
    monkeypatch.setenv("PROVIDER_KEY", "sk-provider")


@asynccontextmanager
async def world(**fields: Any) -> AsyncIterator[Gateway]:
    """`reasoning`: a local backend, falling back to the provider `cloud` (priced)."""
    async with (
        fake_vllm(models=["reasoning"], max_tokens=4) as local,
        fake_openai_provider("sk-provider") as cloud,
    ):
        settings = cloud_settings(
            {"reasoning": {"url": local.url, "models": ["reasoning"]}},
            {"cloud": {"kind": "openai", "base_url": cloud.base_url, "cost_per_mtok": PRICE,
                       "api_key_env": "PROVIDER_KEY", "model": "cloud-model"}},
            {"reasoning": ["reasoning", "cloud"]},
            client_keys={"keys": KEYS},
            **fields,
        )  # fmt: skip
        async with gateway(settings) as gw:
            yield gw


def services(gw: Gateway) -> Services:
    found: Services = gw.app.state.services
    return found


async def ask(gw: Gateway, secret: str) -> dict[str, Any]:
    answer = await gw.client.post(
        "/v1/chat/completions",
        json={"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {secret}"},
    )
    assert answer.status_code == 200, answer.text
    usage: dict[str, Any] = answer.json()["usage"]
    return usage


async def usage(gw: Gateway, query: str = "", secret: str | None = None) -> httpx.Response:
    headers = {} if secret is None else {"authorization": f"Bearer {secret}"}
    return await gw.client.get(f"/usage{query}", headers=headers)


async def test_usage_is_grouped_and_a_client_key_reads_only_its_own() -> None:
    async with world() as gw:
        local = [await ask(gw, AGENTS), await ask(gw, AGENTS), await ask(gw, FAMILY)]
        services(gw).backends["reasoning"].block("game", "a game", kind=BlockKind.YIELDED)
        cloud = await ask(gw, FAMILY)
        await services(gw).usage.writer.flush()

        by_key = (await usage(gw, "?group_by=key")).json()
        rows = {r["key"]: r for r in by_key["rows"]}
        assert rows["agents"]["requests"] == 2
        assert rows["agents"]["cloud_tokens"] == 0
        assert rows["family"]["requests"] == 2
        assert rows["family"]["cloud_tokens"] == cloud["total_tokens"]
        assert by_key["totals"]["requests"] == 4
        tokens = sum(u["total_tokens"] for u in [*local, cloud])
        totals = by_key["totals"]
        assert totals["prompt_tokens"] + totals["completion_tokens"] == tokens

        by_route = {r["route"]: r for r in (await usage(gw, "?group_by=route")).json()["rows"]}
        assert by_route["reasoning"]["cloud"] is False
        assert by_route["reasoning"]["cost"] is None
        assert by_route["cloud"]["cloud"] is True
        expected = (cloud["prompt_tokens"] * 1.0 + cloud["completion_tokens"] * 2.0) / 1e6
        assert by_route["cloud"]["cost"] == pytest.approx(expected)

        (model,) = (await usage(gw, "?group_by=model")).json()["rows"]
        assert (model["model"], model["requests"]) == ("reasoning", 4)
        today = time.strftime("%Y-%m-%d", time.gmtime())
        (day,) = (await usage(gw, "?group_by=day")).json()["rows"]
        assert (day["day"], day["requests"]) == (today, 4)
        assert (await usage(gw, "?since=2000-01-01&until=2000-01-02")).json()["rows"] == []
        assert (await usage(gw, "?group_by=prompt")).status_code == 400

        # A client key: its own rows only, whatever it asks for.
        mine = (await usage(gw, "?group_by=key", secret=AGENTS)).json()
        assert [r["key"] for r in mine["rows"]] == ["agents"]
        assert mine["totals"]["requests"] == 2
        other = await usage(gw, "?key=family", secret=AGENTS)
        assert other.status_code == 403
        assert other.json()["error"]["code"] == "permission_denied"

        summary = (await gw.client.get("/usage/summary")).json()
        views = {k["key"]: k for k in summary["keys"]}
        assert views["family"]["today"]["cloud_tokens"] == cloud["total_tokens"]
        assert views["family"]["last_7_days"]["cost"] == pytest.approx(expected)
        assert views["agents"]["today"]["local_tokens"] == sum(u["total_tokens"] for u in local[:2])
        own = await gw.client.get("/usage/summary", headers={"authorization": f"Bearer {FAMILY}"})
        assert [k["key"] for k in own.json()["keys"]] == ["family"]


async def test_many_requests_make_few_commits() -> None:
    async with world(store={"flush_interval_s": 0.5, "flush_rows": 10_000}) as gw:
        writer = services(gw).usage.writer
        before = writer.commits
        for _ in range(40):
            await ask(gw, AGENTS)
        await until(lambda: writer.status()["pending"] == 0, what="the batch written")
        assert 1 <= writer.commits - before <= 4  # batched: not one commit per request
        await services(gw).usage.writer.flush()
        rows = (await usage(gw, "?group_by=key")).json()["rows"]
        assert rows[0]["requests"] == 40


async def test_a_store_that_cannot_be_written_is_said_and_catches_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with world(store={"flush_interval_s": 0.05}) as gw:
        error = sqlite_disk_full(monkeypatch)
        await ask(gw, AGENTS)

        async def failing() -> dict[str, Any] | None:
            state: dict[str, Any] = (await gw.client.get("/status")).json()["state"]
            return state if state["usage"]["error"] else None

        state = await until(failing, what="the failed batch said")
        assert error in state["usage"]["error"]
        assert state["usage"]["pending"] >= 2  # the usage row and the activity entry
        failures = gw.registry.get_sample_value("microscheduler_store_write_failures_total")
        assert failures is not None
        assert failures >= 1
        # Requests are still served while the store cannot be written.
        await ask(gw, AGENTS)

        monkeypatch.undo()

        async def written() -> bool:
            state = (await gw.client.get("/status")).json()["state"]
            return bool(state["usage"]["error"] is None and state["usage"]["pending"] == 0)

        await until(written, what="the kept rows written")
        (row,) = (await usage(gw, "?group_by=key")).json()["rows"]
        assert row["requests"] == 2
