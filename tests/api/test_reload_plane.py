"""One routing plane (`app.routing.plane`): a reload builds the next one with the start's
function and swaps it in once, all parts together; a request reads the plane once and is
routed, authorised and accounted with that one even when a reload lands while it runs;
LoRA adapters live on their backend, so an in-place reload keeps the loaded ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.services import Services
from app.settings import load_settings
from tests.fakes.servers import FakeServer, Gateway, chat, fake_vllm, gateway

AGENTS = "sk-agents-1f2e"


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTS_KEY", AGENTS)


def write(config_dir: Path, models: dict[str, Any], keys: dict[str, Any] | None = None) -> None:
    config_dir.mkdir(exist_ok=True)
    (config_dir / "models.yaml").write_text(yaml.safe_dump(models, sort_keys=False))
    if keys is not None:
        (config_dir / "keys.yaml").write_text(yaml.safe_dump({"keys": keys}, sort_keys=False))


async def chats(server: FakeServer) -> int:
    """The chat requests `server` received."""
    requests = (await server.stats())["requests"]
    return sum(r["path"] == "/v1/chat/completions" for r in requests)


def services_of(gw: Gateway) -> Services:
    services: Services = gw.app.state.services
    return services


async def reload(gw: Gateway) -> dict[str, Any]:
    answer = await gw.client.post("/config/reload")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def served_on(gw: Gateway) -> float:
    """The requests key `agents` was served (its metric: every plane's key object)."""
    labels = {"key": "agents", "outcome": "served"}
    return gw.registry.get_sample_value("microscheduler_key_requests_total", labels) or 0.0


async def running_key_served(gw: Gateway) -> int:
    """The requests served on the running plane's key object `agents` (`/status`)."""
    status = (await gw.client.get("/status")).json()
    (key,) = [k for k in status["keys"] if k["name"] == "agents"]
    served: int = key["requests"].get("served", 0)
    return served


async def test_a_request_keeps_its_plane_when_a_reload_lands_while_its_body_is_read(
    tmp_path: Path,
) -> None:
    """The key is checked on arrival and the model routed after the body is read: both on
    the plane the request arrived on. The old code read the key from the running plane and
    the route from the next one: 404 for a name the request's own key allowed."""
    config_dir = tmp_path / "config"
    async with fake_vllm(models=["steady"], max_tokens=2) as fake:
        models = {"backends": {"steady": {"url": fake.url, "models": ["steady"],
                                          "aliases": ["old-name"]}}}  # fmt: skip
        keys = {"agents": {"key_env": "AGENTS_KEY", "models": ["old-name"]}}
        write(config_dir, models, keys)
        async with gateway(load_settings(config_dir)) as gw:
            reading, go_on = asyncio.Event(), asyncio.Event()

            async def body() -> AsyncIterator[bytes]:
                yield b'{"model": "old-name", '
                reading.set()  # the handler asks for more: it has the key already
                await go_on.wait()
                yield b'"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'

            auth = {"authorization": f"Bearer {AGENTS}", "content-type": "application/json"}
            request = asyncio.create_task(
                gw.client.post("/v1/chat/completions", content=body(), headers=auth)
            )
            await asyncio.wait_for(reading.wait(), 10)
            models["backends"]["steady"]["aliases"] = ["new-name"]
            keys["agents"]["models"] = ["new-name"]
            write(config_dir, models, keys)
            assert (await reload(gw))["updated"] == ["steady"]
            go_on.set()
            answer = await asyncio.wait_for(request, 10)

            assert answer.status_code == 200, answer.text
            assert served_on(gw) == 1
            # Counted on the key of the plane it arrived on, not on the next plane's key.
            assert await running_key_served(gw) == 0
            # A request arriving now reads the new plane.
            now = {"authorization": f"Bearer {AGENTS}"}
            gone = await gw.client.post("/v1/chat/completions", json=chat("old-name"), headers=now)
            assert gone.status_code == 404, gone.text
            new = await gw.client.post("/v1/chat/completions", json=chat("new-name"), headers=now)
            assert new.status_code == 200, new.text
            assert await running_key_served(gw) == 1
            assert served_on(gw) == 2


async def test_a_reload_swaps_the_plane_once_with_every_part_built_together(
    tmp_path: Path,
) -> None:
    """A reload that rebuilds one backend, adds one and removes one: one new plane
    (generation + 1, not one swap before the take-down and another after), whose parts
    were built from one configuration: the registry names the added model, the auth
    checks the plane's own keys, the dispatcher routes with the plane's registry."""
    config_dir = tmp_path / "config"
    async with (
        fake_vllm(models=["kept"], max_tokens=2) as first,
        fake_vllm(models=["kept"], max_tokens=2) as second,
        fake_vllm(models=["added"], max_tokens=2) as third,
    ):
        models: dict[str, Any] = {
            "backends": {
                "kept": {"url": first.url, "models": ["kept"]},
                "gone": {"url": third.url, "models": ["gone-model"]},
            }
        }
        write(config_dir, models, {"agents": {"key_env": "AGENTS_KEY"}})
        async with gateway(load_settings(config_dir)) as gw:
            services = services_of(gw)
            before = services.plane
            assert before.generation == 0
            assert before.settings is services.settings
            models["backends"] = {
                "kept": {"url": second.url, "models": ["kept"]},  # rebuilt: a new address
                "added": {"url": third.url, "models": ["added"]},
            }
            write(config_dir, models, {"agents": {"key_env": "AGENTS_KEY", "rpm": 100}})
            answer = await reload(gw)
            assert answer["restarted"] == ["kept"]
            assert answer["added"] == ["added"]
            assert answer["removed"] == ["gone"]

            after = services.plane
            assert after.generation == before.generation + 1  # one swap
            assert after.settings is services.settings
            for part in ("registry", "cloud", "keys", "auth", "dispatcher"):
                assert getattr(after, part) is not getattr(before, part), part
            assert after.auth.keys is after.keys
            assert after.registry.resolve("added") is not None
            assert after.registry.resolve("gone-model") is None
            assert after.dispatcher.route("added").backend == "added"
            assert before.registry.resolve("gone-model") is not None  # the old plane is whole
            assert services.retired == [before.cloud]  # the backends' names changed
            (key,) = after.keys.keys
            assert key.view()["rpm"] == 100
            headers = {"authorization": f"Bearer {AGENTS}"}
            for model in ("kept", "added"):
                served = await gw.client.post(
                    "/v1/chat/completions", json=chat(model), headers=headers
                )
                assert served.status_code == 200, served.text
            assert services.plane is after  # requests do not swap anything


async def test_a_request_of_an_old_plane_for_a_removed_backend_is_refused_as_disabled(
    tmp_path: Path,
) -> None:
    """A request that arrived before a reload removed its backend, and is routed after the
    backend is gone: 503 `backend_disabled`, as the reload's block answered while it was
    drained (not a 500 for a backend the plane still names)."""
    config_dir = tmp_path / "config"
    async with (
        fake_vllm(models=["stays"], max_tokens=2) as stays,
        fake_vllm(models=["goes"], max_tokens=2) as goes,
    ):
        models: dict[str, Any] = {
            "backends": {
                "stays": {"url": stays.url, "models": ["stays"]},
                "goes": {"url": goes.url, "models": ["goes"]},
            }
        }
        write(config_dir, models)
        async with gateway(load_settings(config_dir)) as gw:
            reading, go_on = asyncio.Event(), asyncio.Event()

            async def body() -> AsyncIterator[bytes]:
                yield b'{"model": "goes", '
                reading.set()
                await go_on.wait()
                yield b'"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'

            request = asyncio.create_task(
                gw.client.post(
                    "/v1/chat/completions",
                    content=body(),
                    headers={"content-type": "application/json"},
                )
            )
            await asyncio.wait_for(reading.wait(), 10)
            del models["backends"]["goes"]
            write(config_dir, models)
            assert (await reload(gw))["removed"] == ["goes"]
            assert "goes" not in services_of(gw).backends
            go_on.set()
            answer = await asyncio.wait_for(request, 10)
            assert answer.status_code == 503, answer.text
            error = answer.json()["error"]
            assert error["code"] == "backend_disabled"
            assert "configuration reload" in error["message"]


async def test_an_in_place_reload_keeps_the_backends_loaded_adapters(tmp_path: Path) -> None:
    """The adapters loaded on a backend's server are the backend's (`Backend.adapters`): a
    reload that changes the backend in place does not load them again; a rebuilt backend
    (a new server life) starts with none."""
    config_dir = tmp_path / "config"
    async with fake_vllm(models=["base"], max_tokens=2, allow_runtime_lora=True) as fake:
        backend: dict[str, Any] = {
            "url": fake.url,
            "models": ["base"],
            "adapters": {"sql-lora": "/a/sql"},
        }
        write(config_dir, {"backends": {"b": backend}})
        async with gateway(load_settings(config_dir)) as gw:
            services = services_of(gw)

            async def loads() -> int:
                requests = (await fake.stats())["requests"]
                return sum(r["path"] == "/v1/load_lora_adapter" for r in requests)

            served = await gw.client.post("/v1/chat/completions", json=chat("sql-lora"))
            assert served.status_code == 200, served.text
            assert services.backends["b"].adapters.loaded == ["sql-lora"]
            backend["priority"] = 70  # in place
            write(config_dir, {"backends": {"b": backend}})
            assert (await reload(gw))["updated"] == ["b"]
            again = await gw.client.post("/v1/chat/completions", json=chat("sql-lora"))
            assert again.status_code == 200, again.text
            assert await loads() == 1
            backend["max_loras"] = 2  # rebuilt: a new backend object, its own adapters
            write(config_dir, {"backends": {"b": backend}})
            assert (await reload(gw))["restarted"] == ["b"]
            assert services.backends["b"].adapters.loaded == []
            third = await gw.client.post("/v1/chat/completions", json=chat("sql-lora"))
            assert third.status_code == 200, third.text
            assert await loads() == 2


class Held:
    """A chat request for `model` whose body is held half sent: the handler has read the
    plane (and the key) and waits for the rest until `go_on()`."""

    def __init__(self, gw: Gateway, model: str) -> None:
        self.reading, self._go_on = asyncio.Event(), asyncio.Event()
        self._task = asyncio.create_task(
            gw.client.post(
                "/v1/chat/completions",
                content=self._body(model),
                headers={"content-type": "application/json"},
            )
        )

    async def _body(self, model: str) -> AsyncIterator[bytes]:
        yield b'{"model": "' + model.encode() + b'", '
        self.reading.set()
        await self._go_on.wait()
        yield b'"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'

    async def answer(self) -> httpx.Response:
        self._go_on.set()
        return await asyncio.wait_for(self._task, 10)


async def test_a_request_of_an_old_plane_walks_its_chain_past_a_removed_backend(
    tmp_path: Path,
) -> None:
    """The request's chain is its plane's: an entry a reload removed meanwhile is passed
    over as disabled (`local_disabled`), the next entry serves. The old code routed it on
    the next plane's chain (no fallback); without the check, a KeyError (500)."""
    config_dir = tmp_path / "config"
    async with (
        fake_vllm(models=["home-model"], max_tokens=2) as home,
        fake_vllm(models=["gone-model"], max_tokens=2) as gone,
    ):
        models: dict[str, Any] = {
            "backends": {
                "home": {"url": home.url, "models": ["home-model"], "aliases": ["chained"]},
                "gone": {"url": gone.url, "models": ["gone-model"]},
            }
        }
        chains = {"chains": {"chained": {"entries": ["gone", "home"]}}}
        write(config_dir, models)
        (config_dir / "cloud_providers.yaml").write_text(yaml.safe_dump(chains))
        async with gateway(load_settings(config_dir)) as gw:
            held = Held(gw, "chained")
            await asyncio.wait_for(held.reading.wait(), 10)
            del models["backends"]["gone"]
            write(config_dir, models)
            chains["chains"]["chained"]["entries"] = ["home"]
            (config_dir / "cloud_providers.yaml").write_text(yaml.safe_dump(chains))
            assert (await reload(gw))["removed"] == ["gone"]
            answer = await held.answer()
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-microscheduler-route"] == "home"
            assert answer.headers["x-microscheduler-fallbacks"] == "1; gone=local_disabled"


async def test_a_request_of_an_old_plane_picks_a_replica_the_reload_kept(
    tmp_path: Path,
) -> None:
    """A replica group whose member a reload removed while a request of the old plane
    waited: the pick leaves the removed member out (not a KeyError, 500)."""
    config_dir = tmp_path / "config"
    async with (
        fake_vllm(models=["shared"], max_tokens=2) as kept,
        fake_vllm(models=["shared"], max_tokens=2) as gone,
    ):
        group = {"models": ["shared"], "replica_of": "pool"}
        models: dict[str, Any] = {
            "backends": {
                "gone": {"url": gone.url, **group},
                "kept": {"url": kept.url, **group},
            }
        }
        write(config_dir, models)
        async with gateway(load_settings(config_dir)) as gw:
            held = Held(gw, "shared")
            await asyncio.wait_for(held.reading.wait(), 10)
            del models["backends"]["gone"]
            write(config_dir, models)
            assert (await reload(gw))["removed"] == ["gone"]
            answer = await held.answer()
            assert answer.status_code == 200, answer.text
            assert await chats(kept) == 1
