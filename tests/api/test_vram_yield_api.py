"""VRAM yield for gaming, measured on the simulated GPU: the fake vLLM servers report
their footprint to its ledger (and drop it while asleep), like NVML would see them.

Layout of every test: a 32768 MiB GPU with a pinned orchestrator (16000 MiB), a lazy
reasoning backend (11000 MiB, yields by stopping) and a lazy embeddings backend (1000
MiB, yields by sleeping; 125 MiB while asleep).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.cli.backends import render_ps
from app.cli.status import render as render_status
from app.gpu.ledger import LedgerWriter, read_ledger
from app.runtimes.base import Runtime
from app.services import Seams, Services
from app.settings import BackendConfig
from app.upstreams.vllm import control_timeout_s
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeVllmRuntime,
    Gateway,
    chat,
    gateway,
    gateway_settings,
    settle_yields_quickly,
    until_backend,
)
from tests.fakes.waits import until

TOTAL = 32768
ORCH, REASONING, EMBED, EMBED_ASLEEP = 16000, 11000, 1000, 125


@pytest.fixture(autouse=True)
def _settle_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    settle_yields_quickly(monkeypatch)


class Rig:
    def __init__(self, tmp_path: Path, *, embed_dev_mode: bool = True) -> None:
        self.ledger = tmp_path / "ledger"
        self.state_dir = tmp_path / "var"
        self.ports = {"orchestrator": free_port(), "reasoning": free_port(), "embed": free_port()}
        self.embed_dev_mode = embed_dev_mode
        self.runtimes: dict[str, FakeVllmRuntime] = {}
        self.new_runtimes()

    def new_runtimes(self) -> None:
        """Fresh fake servers (a gateway's shutdown stops the in-process ones)."""
        ledger = str(self.ledger)
        self.runtimes = {
            "orchestrator": FakeVllmRuntime(
                self.ports["orchestrator"], models=["orch-model"], vram_mib=ORCH,
                sim_gpu_dir=ledger,
            ),
            "reasoning": FakeVllmRuntime(
                self.ports["reasoning"], models=["reasoning-model"], vram_mib=REASONING,
                sim_gpu_dir=ledger, max_tokens=12, tokens_per_second=40,
            ),
            "embed": FakeVllmRuntime(
                self.ports["embed"], models=["embed-model"], vram_mib=EMBED,
                vram_asleep_mib=EMBED_ASLEEP, sim_gpu_dir=ledger, dev_mode=self.embed_dev_mode,
            ),
        }  # fmt: skip

    def backends(self, **overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
        def url(name: str) -> str:
            return f"http://127.0.0.1:{self.ports[name]}"

        process = {"kind": "process", "command": ["unused: the test's runtime runs it"]}
        backends: dict[str, dict[str, Any]] = {
            "orchestrator": {
                "url": url("orchestrator"), "models": ["orch-model"], "runtime": process,
                "vram_mib": ORCH, "priority": 90,
            },
            "reasoning": {
                "url": url("reasoning"), "models": ["reasoning-model"], "runtime": process,
                "lifecycle": "lazy", "vram_mib": REASONING, "priority": 50,
            },
            "embed": {
                "url": url("embed"), "models": ["embed-model"], "runtime": process,
                "lifecycle": "lazy", "vram_mib": EMBED, "priority": 40,
                "yield": {"method": "sleep", "level": 1},
            },
        }  # fmt: skip
        for name, fields in overrides.items():
            backends[name] = {**backends[name], **fields}
        return backends

    @asynccontextmanager
    async def gateway(
        self, auto_yield: dict[str, Any] | None = None, **overrides: dict[str, Any]
    ) -> AsyncIterator[Gateway]:
        def runtime_for(name: str, config: BackendConfig) -> Runtime:
            return self.runtimes[name]

        settings = gateway_settings(
            self.backends(**overrides),
            state_dir=self.state_dir,
            gpu={
                "probe": "sim",
                "poll_interval_s": 0.05,
                "sim": {"total_mib": TOTAL, "ledger_dir": self.ledger},
                "auto_yield": auto_yield or {},
            },
            reaper_interval_s=0.05,
        )
        async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
            await until_backend(gw, "orchestrator", state="ready")
            yield gw

    def used(self) -> int:
        import time

        return read_ledger(self.ledger, now=time.time()).get(0, 0)


def vram_cell(table: str, backend: str) -> str:
    """The `VRAM MiB` column of `backend`'s row in a `status` or `ps` table."""
    lines = [line for line in table.splitlines() if line.startswith(("backend ", f"{backend} "))]
    header, row = (re.split(r"\s{2,}", line) for line in lines[-2:])
    return row[header.index("VRAM MiB")]


def metric_value(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in the scrape")


def sample(text: str, name: str, labels: dict[str, str]) -> float | None:
    for family in text_string_to_metric_families(text):
        for one in family.samples:
            if one.name == name and one.labels == labels:
                return float(one.value)
    return None


async def wake_all(gw: Gateway) -> None:
    for model in ("reasoning-model", "embed-model"):
        response = await gw.client.post("/v1/chat/completions", json=chat(model, max_tokens=2))
        assert response.status_code == 200, response.text


async def test_a_yield_frees_what_the_stopped_and_slept_backends_held(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        await wake_all(gw)
        assert rig.used() == ORCH + REASONING + EMBED
        response = await gw.client.post("/vram/yield", json={"reason": "gaming"})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["state"] == "yielded"
        assert body["already"] is False
        assert body["stopped"] == ["reasoning"]
        assert body["slept"] == ["embed"]
        assert body["freed_mib"] == REASONING + EMBED - EMBED_ASLEEP  # measured, not summed
        assert body["free_mib"] == TOTAL - ORCH - EMBED_ASLEEP
        assert body["measured_by"] == "sim"
        assert rig.used() == ORCH + EMBED_ASLEEP
        assert (await until_backend(gw, "embed", state="sleeping"))["blocked_by"]

        # While yielded nothing wakes: 503 naming the yield, no start, no wake-up.
        starts = rig.runtimes["reasoning"].starts
        for model in ("reasoning-model", "embed-model"):
            refused = await gw.client.post("/v1/chat/completions", json=chat(model))
            assert refused.status_code == 503
            error = refused.json()["error"]
            assert error["code"] == "backend_yielded"
            assert "VRAM yield for 'gaming'" in error["message"]
            # Held until restored: a few seconds, so SDKs back off instead of retrying at once.
            assert refused.headers["retry-after"] == "10"
        assert rig.runtimes["reasoning"].starts == starts
        assert rig.used() == ORCH + EMBED_ASLEEP
        # The pinned orchestrator was not in the yield and still serves.
        served = await gw.client.post("/v1/chat/completions", json=chat("orch-model"))
        assert served.status_code == 200

        again = (await gw.client.post("/vram/yield", json={"reason": "gaming"})).json()
        assert again["already"] is True
        assert again["freed_mib"] == body["freed_mib"]
        state = (await gw.client.get("/vram/yield")).json()
        assert state["state"] == "yielded"
        assert state["held_mib"] == body["free_mib"]
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_vram_yield_active{host="local"} 1.0' in metrics
        freed = metric_value(metrics, "microscheduler_vram_yield_freed_bytes")
        assert freed == body["freed_mib"] * 1024 * 1024
        assert 'microscheduler_vram_yields_total{host="local",outcome="already"} 1.0' in metrics

        restored = (await gw.client.post("/vram/restore")).json()
        assert restored["state"] == "restored"
        assert restored["back"] == []
        assert sorted(restored["on_demand"]) == ["embed", "reasoning"]
        assert (await gw.client.get("/vram/yield")).json() == {"state": "none", "host": "local"}
        # Lazy ones come back on their next request: the sleeping one is woken, not started.
        embed_starts = rig.runtimes["embed"].starts
        await wake_all(gw)
        assert rig.runtimes["embed"].starts == embed_starts
        assert rig.used() == ORCH + REASONING + EMBED
        assert (await gw.client.post("/vram/restore")).json()["restored"] is False


async def test_a_yield_stops_in_priority_order_only_until_min_free_is_met(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        await wake_all(gw)
        free = TOTAL - ORCH - REASONING - EMBED  # 4768
        body = (await gw.client.post("/vram/yield", json={"min_free_mib": free + 500})).json()
        # embed (priority 40) goes first and its sleep is enough.
        assert body["slept"] == ["embed"]
        assert body["stopped"] == []
        assert body["met"] is True
        assert body["free_mib"] == free + EMBED - EMBED_ASLEEP
        assert body["held_mib"] == free + 500
        # reasoning kept running and keeps serving.
        served = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert served.status_code == 200
        # The held memory keeps other starts out: a lazy start now would not fit.
        status = (await gw.client.get("/status")).json()
        assert status["holds"]["yield"]["state"] == "yielded"


async def test_an_ask_beyond_the_gpu_is_refused_before_anything_is_taken(
    tmp_path: Path,
) -> None:
    """40,000 MiB of a 32 GiB GPU: a 400 in the API's format, nothing stopped or slept."""
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        await wake_all(gw)
        response = await gw.client.post("/vram/yield", json={"min_free_mib": 40000})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_value"
        assert error["param"] == "min_free_mib"
        assert "40,000 MiB is more than GPU 0 has (32,768 MiB in all)" in error["message"]
        assert (await gw.client.get("/vram/yield")).json() == {"state": "none", "host": "local"}
        assert rig.used() == ORCH + REASONING + EMBED
        for name in ("reasoning", "embed"):
            assert (await until_backend(gw, name, state="ready"))["blocked_by"] == []


async def test_a_yield_that_cannot_free_its_ask_is_undone_and_refused(tmp_path: Path) -> None:
    """One verdict for the page and the CLI: the gateway undoes a yield short of its
    `min_free_mib` and answers 409 `yield_not_met`, saying what still holds the GPU."""
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        await wake_all(gw)
        ask = TOTAL - ORCH + 1000  # the pinned orchestrator stays: out of reach
        response = await gw.client.post("/vram/yield", json={"min_free_mib": ask})
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "yield_not_met"
        message = error["message"]
        assert f"free on GPU 0 after the yield, not the {ask:,} MiB asked for" in message
        assert "the yield is undone" in message
        assert "stopped reasoning and put embed to sleep" in message
        assert "still holding memory: orchestrator (pinned; include_pinned is false)" in message
        assert (await gw.client.get("/vram/yield")).json() == {"state": "none", "host": "local"}
        # What it took serves again on demand: nothing stays blocked.
        for name in ("reasoning", "embed"):
            view = next(
                b for b in (await gw.client.get("/status")).json()["backends"] if b["name"] == name
            )
            assert view["blocked_by"] == [], view
        await wake_all(gw)
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_vram_yields_total{host="local",outcome="failed"} 1.0' in metrics
        assert sample(metrics, "microscheduler_vram_yields_total",
                      {"host": "local", "outcome": "restored"}) in (None, 0.0)  # fmt: skip


async def test_include_pinned_takes_the_orchestrator_and_restore_starts_it_again(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        body = (await gw.client.post("/vram/yield", json={"include_pinned": True})).json()
        assert body["stopped"] == ["orchestrator"]  # the lazy ones were not running
        assert sorted(body["blocked"]) == ["embed", "reasoning"]
        assert body["freed_mib"] == ORCH
        assert body["free_mib"] == TOTAL
        refused = await gw.client.post("/v1/chat/completions", json=chat("orch-model"))
        assert refused.json()["error"]["code"] == "backend_yielded"
        restored = (await gw.client.post("/vram/restore")).json()
        assert restored["order"] == ["orchestrator"]  # the order it brings them back in
        assert restored["back"] == ["orchestrator"]
        assert rig.used() == ORCH
        status = (await gw.client.get("/status")).json()
        orchestrator = next(b for b in status["backends"] if b["name"] == "orchestrator")
        # What its start added on the GPU, as the probe measured it.
        assert orchestrator["vram"] == {
            "configured_mib": ORCH,
            "profile_mib": None,
            "admission_mib": ORCH,
            "footprint": {"mib": ORCH, "source": "vram_mib"},
            "measured_mib": ORCH,
        }
        served = await gw.client.post("/v1/chat/completions", json=chat("orch-model"))
        assert served.status_code == 200


async def test_a_yield_lets_a_stream_in_flight_finish(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        stream = asyncio.create_task(
            gw.client.post("/v1/chat/completions", json=chat("reasoning-model", stream=True))
        )
        await until_backend(gw, "reasoning", in_flight=1)  # 12 tokens at 40/s: under way
        body = (await gw.client.post("/vram/yield", json={})).json()
        response = await stream
        assert response.status_code == 200
        assert response.text.rstrip().endswith("data: [DONE]")
        assert '"error"' not in response.text
        assert body["stopped"] == ["reasoning"]
        assert body["drain_timeouts"] == []
        assert body["duration_s"] >= 0.1


async def test_a_yield_reports_a_drain_that_timed_out(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.runtimes["reasoning"].options.update(max_tokens=400, tokens_per_second=20)
    async with rig.gateway(reasoning={"drain_timeout_s": 0.2}) as gw:
        stream = asyncio.create_task(
            gw.client.post("/v1/chat/completions", json=chat("reasoning-model", stream=True))
        )
        await until_backend(gw, "reasoning", in_flight=1)
        body = (await gw.client.post("/vram/yield", json={})).json()
        assert body["drain_timeouts"] == ["reasoning"]
        assert body["stopped"] == ["reasoning"]
        response = await stream
        # Cut by the stop: the stream ends with the in-band error and [DONE].
        assert '"error"' in response.text
        assert response.text.rstrip().endswith("data: [DONE]")
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_drain_timeouts_total{backend="reasoning"} 1.0' in metrics


async def test_a_yield_survives_a_gateway_restart(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        await wake_all(gw)
        first = (await gw.client.post("/vram/yield", json={"reason": "elden-ring"})).json()
        assert first["stopped"] == ["reasoning"]
    rig.new_runtimes()
    async with rig.gateway() as gw:
        state = (await gw.client.get("/vram/yield")).json()
        assert state["state"] == "yielded"
        assert state["reason"] == "elden-ring"
        assert state["freed_mib"] == first["freed_mib"]
        refused = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert refused.json()["error"]["code"] == "backend_yielded"
        assert rig.runtimes["reasoning"].starts == 0
        restored = (await gw.client.post("/vram/restore")).json()
        assert sorted(restored["on_demand"]) == ["embed", "reasoning"]
        served = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert served.status_code == 200


async def test_a_yield_ends_by_itself_after_its_ttl(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        body = (
            await gw.client.post("/vram/yield", json={"ttl_s": 0.3, "include_pinned": True})
        ).json()
        assert body["stopped"] == ["orchestrator"]
        await until_backend(gw, "orchestrator", state="ready")  # restarted by the expiry
        assert (await gw.client.get("/vram/yield")).json() == {"state": "none", "host": "local"}
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_vram_yields_total{host="local",outcome="expired"} 1.0' in metrics
        events = (await gw.client.get("/status")).json()["events"]
        assert any(e["kind"] == "vram_restore" and e["why"] == "expired" for e in events)


async def test_without_sleep_mode_the_backend_is_stopped_instead(tmp_path: Path) -> None:
    rig = Rig(tmp_path, embed_dev_mode=False)
    async with rig.gateway() as gw:
        await wake_all(gw)
        body = (await gw.client.post("/vram/yield", json={})).json()
        assert body["slept"] == []
        assert sorted(body["stopped"]) == ["embed", "reasoning"]
        assert body["freed_mib"] == REASONING + EMBED
        metrics = (await gw.client.get("/metrics")).text
        sleeps = {"backend": "embed", "outcome": "stopped", "reason": "yield"}
        assert sample(metrics, "microscheduler_backend_sleeps_total", sleeps) == 1.0


async def test_bad_yield_requests_are_refused_in_openais_error_shape(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        for body in ({"min_free_mib": -1}, {"ttl_s": 0}, {"surprise": 1}, {"gpu": 3}):
            response = await gw.client.post("/vram/yield", json=body)
            assert response.status_code in (400, 422), body
            assert response.json()["error"]["message"], body
        assert (await gw.client.get("/vram/yield")).json() == {"state": "none", "host": "local"}
        conflict = await gw.client.post("/vram/zones/yield/release")
        assert conflict.status_code == 409


async def test_a_game_makes_the_gateway_yield_and_its_end_restores(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    auto = {"enabled": True, "foreign_mib": 2000, "settle_s": 0.2, "restore_after_s": 0.3}
    async with rig.gateway(auto_yield=auto) as gw:
        await wake_all(gw)
        game = LedgerWriter(rig.ledger, pid=os.getpid(), gpus=[0], model="game", port=None)
        game.set_mib(4000)  # the game starts: 4000 MiB the gateway does not manage
        held = await until(lambda: yield_now(gw), timeout_s=10, what="the automatic yield")
        assert held["reason"] == "auto: foreign GPU memory"
        assert held["stopped"] == ["reasoning"]
        assert held["slept"] == ["embed"]
        game.remove()  # the game ends
        await until(lambda: no_yield(gw), timeout_s=10, what="the automatic restore")
        await until_backend(gw, "orchestrator", state="ready")
        kinds = [e["kind"] for e in (await gw.client.get("/status")).json()["events"]]
        assert kinds.index("auto_yield") < kinds.index("vram_yield") < kinds.index("auto_restore")


async def test_the_automatic_restore_never_undoes_a_yield_a_person_asked_for(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    auto = {"enabled": True, "foreign_mib": 2000, "settle_s": 0.1, "restore_after_s": 0.1}
    async with rig.gateway(auto_yield=auto) as gw:
        taken = await gw.client.post("/vram/yield", json={"reason": "by hand"})
        assert taken.json()["state"] == "yielded"
        # No foreign memory at all: an automatic yield would be restored within ~0.2 s.
        await asyncio.sleep(0.5)  # the thing under test: nothing happens in this window
        state = (await gw.client.get("/vram/yield")).json()
        assert (state["state"], state["reason"]) == ("yielded", "by hand")


async def yield_now(gw: Gateway) -> dict[str, Any] | None:
    state: dict[str, Any] = (await gw.client.get("/vram/yield")).json()
    return state if state["state"] == "yielded" else None


async def no_yield(gw: Gateway) -> bool:
    return bool((await gw.client.get("/vram/yield")).json()["state"] == "none")


# -- sleep as the idle and eviction method -------------------------------------------------

IDLE_SLEEP: dict[str, Any] = {"idle_ttl_s": 0.2, "idle": {"method": "sleep", "level": 1}}


async def test_an_idle_backend_is_put_to_sleep_and_woken_by_its_next_request(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway(embed=IDLE_SLEEP) as gw:
        await wake_all(gw)
        view = await until_backend(gw, "embed", state="sleeping")
        assert view["idle"] == {"method": "sleep", "level": 1, "action": "sleep"}
        assert view["eviction"] == {"method": "auto", "level": 2}
        assert view["asleep_mib"] == EMBED_ASLEEP  # measured: what the ledger kept showing
        assert view["holds_vram"] is True
        assert rig.used() == ORCH + REASONING + EMBED_ASLEEP
        metrics = (await gw.client.get("/metrics")).text
        slept = {"backend": "embed", "outcome": "slept", "reason": "idle"}
        assert sample(metrics, "microscheduler_backend_sleeps_total", slept) == 1.0
        # Declared at zero before any eviction by sleep.
        evicted = {"backend": "embed", "outcome": "slept", "reason": "eviction"}
        assert sample(metrics, "microscheduler_backend_sleeps_total", evicted) == 0.0

        starts = rig.runtimes["embed"].starts
        response = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
        assert response.status_code == 200, response.text
        assert rig.runtimes["embed"].starts == starts  # woken (POST /wake_up), not started
        assert rig.used() == ORCH + REASONING + EMBED
        status = (await gw.client.get("/status")).json()
        (embed,) = [b for b in status["backends"] if b["name"] == "embed"]
        assert embed["asleep_mib"] is None


async def test_a_backend_asleep_at_level_2_has_its_weights_reloaded_by_the_wake(
    tmp_path: Path,
) -> None:
    """Level 2 discards the weights: a plain `POST /wake_up` leaves the server answering
    garbage (the fake vLLM: a 500). The wake reloads them as vLLM's sleep-mode docs say."""
    rig = Rig(tmp_path)
    idle = {"idle_ttl_s": 0.2, "idle": {"method": "sleep", "level": 2}}
    async with rig.gateway(embed=idle) as gw, httpx.AsyncClient() as direct:
        await wake_all(gw)
        view = await until_backend(gw, "embed", state="sleeping")
        assert view["reason"].startswith("asleep (level 2, idle")
        fake = f"http://127.0.0.1:{rig.ports['embed']}/_fake/stats"
        assert (await direct.delete(fake)).status_code == 200

        starts = rig.runtimes["embed"].starts
        response = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"]
        assert rig.runtimes["embed"].starts == starts  # woken, not started again
        stats = (await direct.get(fake)).json()
        assert stats["failed"] == 0
        control = [
            (r["method"], r["path"], r["query"], r["body"])
            for r in stats["requests"]
            if r["path"] not in ("/is_sleeping", "/v1/chat/completions")
        ]
        wait = control_timeout_s(None, EMBED * 1024 * 1024)
        assert control == [
            ("POST", "/wake_up", "tags=weights", None),
            # Told the backend's control timeout, scaled by its 1000 MiB (vram_mib).
            ("POST", "/collective_rpc", "", {"method": "reload_weights", "timeout": wait}),
            ("POST", "/wake_up", "tags=kv_cache", None),
            ("POST", "/reset_prefix_cache", "", None),
        ]


async def test_an_idle_backend_without_sleep_mode_is_stopped_instead(tmp_path: Path) -> None:
    rig = Rig(tmp_path, embed_dev_mode=False)
    async with rig.gateway(embed=IDLE_SLEEP) as gw:
        await wake_all(gw)
        await until_backend(gw, "embed", state="stopped")
        assert rig.used() == ORCH + REASONING
        metrics = (await gw.client.get("/metrics")).text
        instead = {"backend": "embed", "outcome": "stopped", "reason": "idle"}
        assert sample(metrics, "microscheduler_backend_sleeps_total", instead) == 1.0
        stops = {"backend": "embed", "reason": "idle"}
        assert sample(metrics, "microscheduler_backend_stops_total", stops) == 1.0


async def test_eviction_by_sleep_counts_the_residue_and_the_wake_is_admitted(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    # Admission counts 16000 for reasoning (its server uses 11000): beside the
    # orchestrator and an awake embed (17000) that does not fit, beside its residue it does.
    async with rig.gateway(
        reasoning={"vram_mib": 16000}, embed={"eviction": {"method": "sleep", "level": 2}}
    ) as gw:
        response = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
        assert response.status_code == 200, response.text
        response = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert response.status_code == 200, response.text
        view = await until_backend(gw, "embed", state="sleeping")
        assert view["asleep_mib"] == EMBED_ASLEEP
        assert view["reason"].startswith("asleep (level 2, eviction")
        assert rig.runtimes["embed"].stops == 0
        assert rig.used() == ORCH + REASONING + EMBED_ASLEEP

        # Waking embed takes back 875 MiB; admission counts 32125 placed (643 free) and
        # reasoning has a higher priority: refused, and it stays asleep.
        refused = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "backend_no_vram"
        assert "not enough VRAM to wake" in error["message"]
        view = await until_backend(gw, "embed", state="sleeping")
        assert view["asleep_mib"] == EMBED_ASLEEP
        assert rig.used() == ORCH + REASONING + EMBED_ASLEEP  # not woken

        # Once reasoning is gone the wake fits.
        stopped = await gw.client.post("/backends/reasoning/stop")
        assert stopped.status_code == 200, stopped.text
        response = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
        assert response.status_code == 200, response.text
        assert rig.runtimes["embed"].starts == 1
        assert rig.used() == ORCH + EMBED


async def test_a_yield_takes_an_idle_sleeper_as_it_is(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway(embed=IDLE_SLEEP) as gw:
        await wake_all(gw)
        await until_backend(gw, "embed", state="sleeping")
        body = (await gw.client.post("/vram/yield", json={"reason": "gaming"})).json()
        # Asleep before the yield: it freed nothing now, and the answer says so.
        assert body["already_asleep"] == ["embed"]
        assert body["slept"] == []
        assert body["stopped"] == ["reasoning"]
        assert body["freed_mib"] == REASONING
        assert body["free_mib"] == TOTAL - ORCH - EMBED_ASLEEP
        # The yield holds what is free; the sleeper counts its residue, not its footprint:
        # together they fill the GPU exactly, nothing counted twice.
        services: Services = gw.app.state.services
        assert services.hosts.local.arbiter.placed_mib() == {0: TOTAL}
        restored = (await gw.client.post("/vram/restore")).json()
        assert sorted(restored["on_demand"]) == ["embed", "reasoning"]
        await wake_all(gw)
        assert rig.used() == ORCH + REASONING + EMBED


async def test_a_yield_of_a_sleeper_only_says_it_was_already_asleep(tmp_path: Path) -> None:
    """The README's sequence with the yield after the idle sleep: nothing is freed, and
    the answer says the sleeper was already asleep, not that the yield put it to sleep."""
    rig = Rig(tmp_path)
    async with rig.gateway(embed=IDLE_SLEEP) as gw:
        response = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
        assert response.status_code == 200, response.text
        await until_backend(gw, "embed", state="sleeping")
        body = (await gw.client.post("/vram/yield", json={"reason": "gaming"})).json()
        assert body["freed_mib"] == 0
        assert (body["slept"], body["stopped"]) == ([], [])
        assert body["already_asleep"] == ["embed"]
        # Still blocked by the yield: a request does not wake it.
        refused = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "backend_yielded"
        assert rig.used() == ORCH + EMBED_ASLEEP
        held = (await gw.client.get("/vram/yield")).json()
        assert held["already_asleep"] == ["embed"]
        restored = (await gw.client.post("/vram/restore")).json()
        assert sorted(restored["on_demand"]) == ["embed", "reasoning"]
        response = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
        assert response.status_code == 200, response.text


async def test_status_and_ps_show_the_same_vram_for_a_sleeper(tmp_path: Path) -> None:
    """What a backend holds now, one number in both tables: asleep, what it kept."""
    rig = Rig(tmp_path)
    async with rig.gateway(embed=IDLE_SLEEP) as gw:
        response = await gw.client.post("/v1/chat/completions", json=chat("embed-model"))
        assert response.status_code == 200, response.text
        await until_backend(gw, "embed", state="sleeping")
        status = (await gw.client.get("/status")).json()
        tables = render_status(status, "gw"), render_ps(status["backends"])
        assert [vram_cell(t, "embed") for t in tables] == [f"{EMBED_ASLEEP:,}"] * 2
        assert [vram_cell(t, "orchestrator") for t in tables] == [f"{ORCH:,}"] * 2
        assert [vram_cell(t, "reasoning") for t in tables] == ["-"] * 2  # never started


async def test_a_sleeper_is_not_blamed_for_a_game_that_filled_the_gpu(tmp_path: Path) -> None:
    """The auto-yield demo: reasoning awake (16000 + 11000 of 32768), a game asks for
    12000 more; the GPU shows it full (32768, not 39000). The yield's sleep of reasoning
    frees 9625, but the full reading before it shows only 3393 freed: reasoning was said
    to hold 7607 MiB asleep, the game's memory. What it holds asleep is what its own
    sleep measured on a GPU that was not full."""
    rig = Rig(tmp_path)
    rig.runtimes["reasoning"].options["dev_mode"] = True  # its fake offers sleep mode
    sleeps = {"yield": {"method": "sleep", "level": 2}}  # level 2: no host RAM budget
    auto = {"enabled": True, "foreign_mib": 2000, "settle_s": 0.1, "restore_after_s": 60}
    asleep = REASONING // 8  # the fake's residue
    async with rig.gateway(auto_yield=auto, reasoning=sleeps) as gw:
        response = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert response.status_code == 200, response.text
        slept = await gw.client.post("/backends/reasoning/sleep")
        assert slept.status_code == 200, slept.text
        assert slept.json()["asleep_mib"] == asleep, slept.json()  # measured on a GPU with room
        response = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert response.status_code == 200, response.text
        assert rig.used() == ORCH + REASONING

        game = LedgerWriter(rig.ledger, pid=os.getpid(), gpus=[0], model="game", port=None)
        game.set_mib(12000)
        try:
            held = await until(lambda: yield_now(gw), timeout_s=10, what="the automatic yield")
            assert held["slept"] == ["reasoning"]
            view = await until_backend(gw, "reasoning", state="sleeping")
            assert view["asleep_mib"] == asleep, view
            assert f"holds {asleep} MiB" in view["reason"]
            assert view["held_mib"] == asleep
        finally:
            game.remove()


# -- each holder of a yield holds it on its own (issue 33) ---------------------------------


async def test_each_holder_holds_the_yield_until_it_lets_go(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        await wake_all(gw)
        first = (await gw.client.post("/vram/yield", json={"reason": "schedule evening"})).json()
        assert (first["already"], first["reason"]) == (False, "schedule evening")
        joined = (await gw.client.post("/vram/yield", json={"reason": "game"})).json()
        assert (joined["already"], joined["reason"]) == (True, "game")  # the caller's own
        assert first["holders"] == ["schedule evening"]
        assert joined["holders"] == ["schedule evening", "game"]
        assert joined["stopped"] == first["stopped"]  # nothing more was taken

        # A restore of one hold leaves the other: the yield holds, nothing comes back.
        released = await gw.client.post("/vram/restore", json={"reason": "game"})
        assert released.status_code == 200, released.text
        assert released.json() == {
            "state": "yielded", "restored": False, "host": "local", "reason": "game",
            "released": True, "holders": ["schedule evening"],
            "holds": [{"reason": "schedule evening", "granted_at": first["granted_at"],
                       "expires_at": None, "expires_in_s": None}],
        }  # fmt: skip
        refused = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert refused.json()["error"]["code"] == "backend_yielded"
        # A holder that holds nothing ends nothing.
        stranger = (await gw.client.post("/vram/restore", json={"reason": "game"})).json()
        assert (stranger["restored"], stranger["released"]) == (False, False)

        # Without a reason: every hold ends, and the answer lists them.
        await gw.client.post("/vram/yield", json={"reason": "game"})
        restored = (await gw.client.post("/vram/restore")).json()
        assert restored["restored"] is True
        assert restored["ended"] == ["schedule evening", "game"]
        assert (await gw.client.get("/vram/yield")).json() == {"state": "none", "host": "local"}
        served = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert served.status_code == 200


async def test_the_last_holds_end_restores_and_each_hold_expires_on_its_own(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        await gw.client.post("/vram/yield", json={"reason": "short", "include_pinned": True,
                                                  "ttl_s": 0.3})  # fmt: skip
        await gw.client.post("/vram/yield", json={"reason": "game"})  # no ttl: never expires
        ended = await until(lambda: hold_or_yield_ended(gw), timeout_s=10, what="the expiry")
        assert (ended["kind"], ended.get("ended")) == ("vram_yield_hold_ended", ["short"])
        assert await holders_are(gw, ["game"])  # the yield holds on for game's hold
        assert rig.runtimes["orchestrator"].starts == 1  # still stopped: game holds it

        ended = (await gw.client.post("/vram/restore", json={"reason": "game"})).json()
        assert (ended["restored"], ended["ended"]) == (True, ["game"])
        await until_backend(gw, "orchestrator", state="ready")  # the last hold's end


async def test_every_hold_survives_a_gateway_restart(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        await wake_all(gw)
        await gw.client.post("/vram/yield", json={"reason": "schedule evening"})
        await gw.client.post("/vram/yield", json={"reason": "game", "ttl_s": 3600})
    rig.new_runtimes()
    async with rig.gateway() as gw:
        state = (await gw.client.get("/vram/yield")).json()
        assert state["holders"] == ["schedule evening", "game"]
        assert [h["expires_at"] is None for h in state["holds"]] == [True, False]
        after = await gw.client.post("/vram/restore", json={"reason": "schedule evening"})
        assert after.json()["holders"] == ["game"]
        refused = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert refused.json()["error"]["code"] == "backend_yielded"


async def holders_are(gw: Gateway, expected: list[str]) -> bool:
    return bool((await gw.client.get("/vram/yield")).json().get("holders") == expected)


async def hold_or_yield_ended(gw: Gateway) -> dict[str, Any] | None:
    """The first event of a hold's or the yield's end, if one happened."""
    events = (await gw.client.get("/status")).json()["events"]
    kinds = ("vram_yield_hold_ended", "vram_restore")
    return next((e for e in events if e["kind"] in kinds), None)
