"""Waits priced in: a request whose caller accepts less wait than a cold local entry's
learned start goes to the next chain entry at once (`cold_start_budget`) while the entry
warms, and is served locally once it is ready. The local backend is the fake vLLM in
process, its port closed for `STARTUP_DELAY_S` after each start as while vLLM loads
(`FakeVllmRuntime(startup_delay_s=)`, the process's `--startup-delay`); the next entry a
fake provider; both on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from app.runtimes.base import Runtime
from app.services import Seams, Services
from app.settings import BackendConfig
from tests.fakes.processes import free_port
from tests.fakes.provider import FakeProvider, cloud_settings, fake_openai_provider
from tests.fakes.servers import FakeVllmRuntime, Gateway, chat, gateway, until_backend

KEY = "sk-test-cloud-0123456789"
AGENTS = "sk-agents-cold-start-0001"
LOCAL_MODEL = "local-model"
STARTUP_DELAY_S = 0.5
ACCEPTED_S = 0.2


def slow_backend(port: int) -> dict[str, Any]:
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": [LOCAL_MODEL],
        "aliases": ["reasoning"],
        "lifecycle": "lazy",
        "vram_mib": 1000,
        "runtime": {"kind": "process", "command": ["unused: the test's runtime runs it"]},
    }


@asynccontextmanager
async def world(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    *,
    chain: dict[str, Any] | None = None,
    key: dict[str, Any] | None = None,
    entries: tuple[str, ...] = ("reasoning", "cloud"),
) -> AsyncIterator[tuple[Gateway, FakeProvider]]:
    monkeypatch.setenv("CLOUD_KEY", KEY)
    monkeypatch.setenv("AGENTS_KEY", AGENTS)
    async with fake_openai_provider(KEY, model="cloud-model", max_tokens=3) as cloud:
        provider = {"kind": "openai", "base_url": cloud.base_url, "api_key_env": "CLOUD_KEY",
                    "model": "cloud-model"}  # fmt: skip
        fields: dict[str, Any] = {}
        if key is not None:
            fields["client_keys"] = {"keys": {"agents": {"key_env": "AGENTS_KEY", **key}}}
        port = free_port()
        runtime = FakeVllmRuntime(port, models=[LOCAL_MODEL], startup_delay_s=STARTUP_DELAY_S)

        def runtime_for(name: str, config: BackendConfig) -> Runtime:
            return runtime

        settings = cloud_settings(
            {"reasoning": slow_backend(port)},
            {"cloud": provider},
            {"reasoning": {"entries": list(entries), **(chain or {})}},
            state_dir=tmp_path / "var",
            **fields,
        )
        async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
            if key is not None:
                gw.client.headers["authorization"] = f"Bearer {AGENTS}"
            yield gw, cloud


async def learn_a_cold_start(gw: Gateway) -> None:
    """Start the backend once (its start is measured), then stop it."""
    started = await gw.client.post("/backends/reasoning/start", timeout=30)
    assert started.status_code == 200, started.text
    stopped = await gw.client.post("/backends/reasoning/stop", timeout=30)
    assert stopped.status_code == 200, stopped.text


WHERE = [
    pytest.param({"chain": {"max_wait_s": ACCEPTED_S}}, {}, id="chain"),
    pytest.param({"key": {"max_wait_s": ACCEPTED_S}}, {}, id="key"),
    pytest.param({}, {"x-microscheduler-max-wait": f"{ACCEPTED_S:g}"}, id="header"),
]


@pytest.mark.parametrize(("config", "headers"), WHERE)
async def test_a_cold_entry_slower_than_the_caller_accepts_answers_from_the_next_at_once(
    config: dict[str, Any],
    headers: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    async with world(monkeypatch, tmp_path, **config) as (gw, cloud):
        await learn_a_cold_start(gw)
        services: Services = gw.app.state.services
        learned = services.backends["reasoning"].ready_in_s()
        assert learned is not None
        assert learned >= STARTUP_DELAY_S

        began = time.monotonic()
        response = await gw.client.post(
            "/v1/chat/completions", json=chat("reasoning"), headers=headers
        )
        took = time.monotonic() - began
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "cloud-model"
        assert response.headers["x-microscheduler-route"] == "cloud"
        assert response.headers["x-microscheduler-fallbacks"] == "1; reasoning=cold_start_budget"
        expected = response.headers["x-microscheduler-expected-wake"]
        assert expected.startswith("reasoning=")
        assert expected.endswith("s")
        assert float(expected.removeprefix("reasoning=").removesuffix("s")) >= STARTUP_DELAY_S
        assert took < STARTUP_DELAY_S  # not held for the start, nor for the chain's wake
        assert cloud.calls == 1
        # The start was begun, not cancelled: the model warms in the background.
        assert services.backends["reasoning"].state in ("starting", "ready")
        entry = (await gw.client.get("/activity")).json()["entries"][0]
        assert entry["route"] == "cloud"
        assert entry["fallbacks"] == 1
        assert entry["fallback_reasons"] == ["cold_start_budget"]
        assert entry["expected_wake_s"] >= STARTUP_DELAY_S

        await until_backend(gw, "reasoning", state="ready")
        again = await gw.client.post(
            "/v1/chat/completions", json=chat("reasoning"), headers=headers
        )
        assert again.status_code == 200, again.text
        assert again.headers["x-microscheduler-route"] == "reasoning"
        assert again.headers["x-microscheduler-fallbacks"] == "0"
        assert "x-microscheduler-expected-wake" not in again.headers
        assert cloud.calls == 1


async def test_without_a_learned_start_the_chain_waits_as_before(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, chain={"max_wait_s": ACCEPTED_S}) as (gw, cloud):
        response = await gw.client.post("/v1/chat/completions", json=chat("reasoning"))
        assert response.status_code == 200, response.text
        assert response.headers["x-microscheduler-route"] == "reasoning"
        assert response.headers["x-microscheduler-fallbacks"] == "0"
        assert cloud.calls == 0


@pytest.mark.parametrize("value", ["-1", "abc", "3601", "1e3", "nan", " "])
@pytest.mark.parametrize("model", ["reasoning", LOCAL_MODEL])
async def test_a_bad_max_wait_header_is_refused(
    value: str, model: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """For any model, with or without a chain (read at the API's edge with the body; it
    was read by the chain only, so a model without one served the request)."""
    async with world(monkeypatch, tmp_path) as (gw, cloud):
        response = await gw.client.post(
            "/v1/chat/completions",
            json=chat(model),
            headers={"x-microscheduler-max-wait": value},
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "x-microscheduler-max-wait"
        assert cloud.calls == 0


async def test_a_bad_max_wait_header_is_refused_before_the_key_counts_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The key saw the request before the chain read the header: it was counted."""
    async with world(monkeypatch, tmp_path, key={"cloud": False}) as (gw, _cloud):
        response = await gw.client.post(
            "/v1/chat/completions",
            json=chat("reasoning"),
            headers={"x-microscheduler-max-wait": "soon"},
        )
        assert response.status_code == 400, response.text
        counted = [
            sample
            for family in gw.registry.collect()
            if family.name == "microscheduler_key_requests"
            for sample in family.samples
            if sample.name.endswith("_total") and sample.labels["key"] == "agents" and sample.value
        ]
        assert counted == []


async def test_the_last_entry_is_waited_for_whatever_the_caller_accepts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Nothing comes after the chain's last entry: it is waited for as before."""
    async with world(monkeypatch, tmp_path, entries=("reasoning",)) as (gw, cloud):
        await learn_a_cold_start(gw)
        response = await gw.client.post(
            "/v1/chat/completions",
            json=chat("reasoning"),
            headers={"x-microscheduler-max-wait": "0"},
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-microscheduler-route"] == "reasoning"
        assert response.headers["x-microscheduler-fallbacks"] == "0"
        assert cloud.calls == 0


async def test_an_asleep_entry_is_priced_by_its_learned_wake(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A wake (sleep -> ready) is measured like a cold start, per sleep level, and priced
    the same way: the first wake is waited for (nothing learned), the second is not."""
    monkeypatch.setenv("CLOUD_KEY", KEY)
    port = free_port()
    # 1750 MiB of weights at 6 GiB/s: each wake takes about 0.28 s.
    runtime = FakeVllmRuntime(port, models=[LOCAL_MODEL], dev_mode=True, vram_mib=2000,
                              vram_asleep_mib=250, wake_gib_per_s=6.0)  # fmt: skip

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtime

    async with fake_openai_provider(KEY, model="cloud-model", max_tokens=3) as cloud:
        provider = {"kind": "openai", "base_url": cloud.base_url, "api_key_env": "CLOUD_KEY",
                    "model": "cloud-model"}  # fmt: skip
        backend = {"url": f"http://127.0.0.1:{port}", "models": [LOCAL_MODEL],
                   "aliases": ["reasoning"], "lifecycle": "lazy", "vram_mib": 2000,
                   "runtime": {"kind": "process", "command": ["unused: the test's runtime"]},
                   "yield": {"method": "sleep", "level": 1}}  # fmt: skip
        settings = cloud_settings(
            {"reasoning": backend},
            {"cloud": provider},
            {"reasoning": {"entries": ["reasoning", "cloud"], "max_wait_s": 0.1}},
            state_dir=tmp_path / "var",
        )
        async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
            services: Services = gw.app.state.services
            assert (await gw.client.post("/backends/reasoning/start")).status_code == 200
            slept = await gw.client.post("/backends/reasoning/sleep")
            assert slept.json()["state"] == "sleeping", slept.text
            assert services.backends["reasoning"].ready_in_s() is None  # no wake measured
            first = await gw.client.post("/v1/chat/completions", json=chat("reasoning"))
            assert first.headers["x-microscheduler-route"] == "reasoning"  # waited, as before

            slept = await gw.client.post("/backends/reasoning/sleep")
            assert slept.json()["state"] == "sleeping", slept.text
            learned = services.backends["reasoning"].ready_in_s()
            assert learned is not None
            assert learned >= 0.2
            second = await gw.client.post("/v1/chat/completions", json=chat("reasoning"))
            assert second.headers["x-microscheduler-route"] == "cloud"
            assert second.headers["x-microscheduler-fallbacks"] == "1; reasoning=cold_start_budget"
            await until_backend(gw, "reasoning", state="ready")  # it woke meanwhile
            third = await gw.client.post("/v1/chat/completions", json=chat("reasoning"))
            assert third.headers["x-microscheduler-route"] == "reasoning"
            assert cloud.calls == 1
