"""LoRA adapters (`adapters:` on a backend): listed with their `parent`, routed by their own
name (the upstream body names the adapter, not the base model), loaded once on first use
(`/v1/load_lora_adapter`), the least recently used unloaded above `max_loras`, loaded again
after the server restarts or discards its weights (level-2 sleep), and scoped by key."""

from __future__ import annotations

import asyncio
import textwrap
from argparse import Namespace
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli.serve import run_check_config
from app.services import Seams
from tests.fakes.nvml import NoNvml
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeServer,
    FakeVllmRuntime,
    Gateway,
    chat,
    fake_vllm,
    gateway,
    gateway_settings,
    until_backend,
)

ADAPTERS = {"sql-lora": "/adapters/sql", "poem-lora": "/adapters/poem", "law-lora": "/adapters/law"}


async def lora_calls(server: FakeServer) -> list[tuple[str, str]]:
    """(route, adapter) of each load/unload the fake received, in order."""
    return [
        (r["path"].rsplit("/", 1)[1], r["body"]["lora_name"])
        for r in (await server.stats())["requests"]
        if r["path"] in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
    ]


async def held(server: FakeServer) -> set[str]:
    """The adapters the fake lists now (its own /v1/models)."""
    cards = (await server.client.get("/v1/models")).json()["data"]
    return {c["id"] for c in cards if c["parent"] is not None}


@asynccontextmanager
async def lora_gateway(**fields: Any) -> AsyncIterator[tuple[Gateway, FakeServer]]:
    async with fake_vllm(models=["base"], max_tokens=2, allow_runtime_lora=True) as fake:
        backend = {"url": fake.url, "models": ["base"], "adapters": ADAPTERS, "max_loras": 2}
        async with gateway(gateway_settings({"b": backend}, **fields)) as gw:
            yield gw, fake


async def test_adapters_are_listed_with_their_parent() -> None:
    async with lora_gateway() as (gw, _):
        cards = {c["id"]: c for c in (await gw.client.get("/v1/models")).json()["data"]}
        assert cards["base"]["parent"] is None
        for name in ADAPTERS:
            assert cards[name]["parent"] == "base"
        one = await gw.client.get("/v1/models/sql-lora")
        assert one.json()["parent"] == "base"


async def test_first_use_loads_once_and_the_body_names_the_adapter() -> None:
    async with lora_gateway() as (gw, fake):
        answers = await asyncio.gather(
            *(gw.client.post("/v1/chat/completions", json=chat("sql-lora")) for _ in range(10))
        )
        assert [a.status_code for a in answers] == [200] * 10
        assert all(a.json()["model"] == "sql-lora" for a in answers)
        assert await lora_calls(fake) == [("load_lora_adapter", "sql-lora")]
        requests = (await fake.stats())["requests"]
        sent = [r["body"]["model"] for r in requests if r["path"] == "/v1/chat/completions"]
        assert sent == ["sql-lora"] * 10  # not rewritten to the base model
        load = next(r for r in requests if r["path"] == "/v1/load_lora_adapter")
        assert load["body"]["lora_path"] == "/adapters/sql"
        base = await gw.client.post("/v1/chat/completions", json=chat("base"))
        assert base.json()["model"] == "base"
        assert len(await lora_calls(fake)) == 1  # the base model loads nothing


async def test_the_least_recently_used_is_unloaded_above_max_loras() -> None:
    async with lora_gateway() as (gw, fake):
        for name in ("sql-lora", "poem-lora", "sql-lora", "law-lora"):
            answer = await gw.client.post("/v1/chat/completions", json=chat(name))
            assert answer.status_code == 200, answer.text
        assert await lora_calls(fake) == [
            ("load_lora_adapter", "sql-lora"),
            ("load_lora_adapter", "poem-lora"),
            ("unload_lora_adapter", "poem-lora"),  # sql-lora was used after it
            ("load_lora_adapter", "law-lora"),
        ]
        assert await held(fake) == {"sql-lora", "law-lora"}


async def test_a_key_uses_only_the_adapters_it_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASE_KEY", "sk-base-0123456789")
    monkeypatch.setenv("SQL_KEY", "sk-sql-0123456789")
    keys = {
        "base-only": {"key_env": "BASE_KEY", "models": ["base"]},
        "sql": {"key_env": "SQL_KEY", "models": ["sql-lora"]},
    }
    async with lora_gateway(client_keys={"keys": keys}) as (gw, fake):
        base_only = {"authorization": "Bearer sk-base-0123456789"}
        refused = await gw.client.post(
            "/v1/chat/completions", json=chat("sql-lora"), headers=base_only
        )
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "model_not_allowed"
        assert await lora_calls(fake) == []  # nothing loaded for a refused request
        listed = await gw.client.get("/v1/models", headers=base_only)
        assert [c["id"] for c in listed.json()["data"]] == ["base"]
        sql = {"authorization": "Bearer sk-sql-0123456789"}
        allowed = await gw.client.post("/v1/chat/completions", json=chat("sql-lora"), headers=sql)
        assert allowed.status_code == 200
        base = await gw.client.post("/v1/chat/completions", json=chat("base"), headers=sql)
        assert base.status_code == 403  # an adapter's key does not reach its base model


@pytest.mark.parametrize(("how", "loads"), [("stop", 2), ("sleep-2", 2), ("sleep-1", 1)])
async def test_loaded_again_once_the_server_lost_them(how: str, loads: int) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(
        port, models=["base"], max_tokens=2, allow_runtime_lora=True, dev_mode=True
    )
    level = 2 if how == "sleep-2" else 1
    backend = {
        "url": f"http://127.0.0.1:{port}",
        "models": ["base"],
        "adapters": ADAPTERS,
        "runtime": {"kind": "process", "command": ["unused"]},
        "yield": {"method": "sleep", "level": level},
    }
    seams = Seams(runtime_factory=lambda _name, _cfg: runtime)
    async with gateway(gateway_settings({"b": backend}), seams=seams) as gw:
        await until_backend(gw, "b", state="ready")
        loads_seen = 0
        for _ in range(2):
            answer = await gw.client.post("/v1/chat/completions", json=chat("sql-lora"))
            assert answer.status_code == 200, answer.text
            async with _direct(port) as direct:
                calls = await lora_calls(direct)
                loads_seen += sum(1 for route, _ in calls if route == "load_lora_adapter")
                await direct.client.delete("/_fake/stats")
            if how == "stop":
                assert (await gw.client.post("/backends/b/stop")).status_code == 200
            else:
                assert (await gw.client.post("/backends/b/sleep")).status_code == 200
        assert loads_seen == loads


def runtime_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


@asynccontextmanager
async def _direct(port: int) -> AsyncIterator[FakeServer]:
    async with httpx.AsyncClient(base_url=runtime_url(port), timeout=5) as client:
        yield FakeServer(runtime_url(port), client)


def test_check_config_warns_of_a_process_backend_without_runtime_lora(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "models.yaml").write_text(
        textwrap.dedent(
            """\
            backends:
              plain:
                url: http://127.0.0.1:8101
                models: [base]
                adapters: {sql-lora: /adapters/sql}
                runtime: {kind: process, command: [vllm, serve, base, --enable-lora]}
              allowed:
                url: http://127.0.0.1:8102
                models: [other]
                adapters: {poem-lora: /adapters/poem}
                runtime:
                  kind: process
                  command: [vllm, serve, other, --enable-lora]
                  env: {VLLM_ALLOW_RUNTIME_LORA_UPDATING: "True"}
            """
        )
    )
    assert run_check_config(Namespace(config=tmp_path), nvml=NoNvml()) == 0
    out = capsys.readouterr().out
    # The backends' (no gpu: block: gpu.probe auto warns too, without NVML).
    warnings = [line for line in out.splitlines() if line.startswith("warning: backends.")]
    assert len(warnings) == 1
    assert "backends.plain.adapters: sql-lora" in warnings[0]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in warnings[0]
