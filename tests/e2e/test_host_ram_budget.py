"""The host RAM budget for real: a gateway process and fake vLLM processes in dev mode
(sleep mode offered) on a simulated GPU. With a budget too small for a sleeper, the
evicted backend and the idle one are stopped (their processes gone) instead of put to
sleep; with room in the budget the evicted one sleeps at level 1 (its process stays)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.processes import free_port, gateway_process, port_is_open
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

LEVEL_1_OR_STOP = {"method": "auto", "level": 1}


def models(ledger: Path, budget_mib: int) -> tuple[dict[str, Any], dict[str, int]]:
    """Two lazy 1000 MiB fakes with sleep mode on a 1500 MiB GPU (one at a time: b evicts
    a), the host RAM budget `budget_mib`; b idles after 1 s."""
    ports = {"a": free_port(), "b": free_port()}

    def backend(name: str) -> dict[str, Any]:
        port = ports[name]
        return {
            "url": f"http://127.0.0.1:{port}", "models": [f"{name}-model"],
            "lifecycle": "lazy", "vram_mib": 1000, "idle_ttl_s": 1.0 if name == "b" else 0,
            "priority": 60 if name == "b" else 40,  # b evicts a
            "sleep_mode": True, "idle": LEVEL_1_OR_STOP, "eviction": LEVEL_1_OR_STOP,
            "runtime": {
                "kind": "process", "env": {"VLLM_SERVER_DEV_MODE": "1"},
                "command": ["{python}", "-m", "app.sim.vllm", "--port", str(port),
                            "--model", f"{name}-model", "--startup-delay", "0.3",
                            "--vram-mib", "1000", "--sim-gpu-dir", str(ledger)],
            },
        }  # fmt: skip

    yaml = {
        "gpu": {"probe": "sim", "poll_interval_s": 0.2,
                "sim": {"total_mib": 1500, "ledger_dir": str(ledger)}},
        "host_ram": {"sleep_budget_mib": budget_mib, "reserve_mib": 0},
        "reaper_interval_s": 0.2,
        "backends": {"a": backend("a"), "b": backend("b")},
    }  # fmt: skip
    return yaml, ports


def ask(url: str, model: str) -> None:
    with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert reply.choices[0].message.content


def state(url: str, name: str) -> dict[str, Any]:
    views = httpx.get(url + "/backends", timeout=10).json()["backends"]
    return next(v for v in views if v["name"] == name)


def releases(url: str) -> list[dict[str, Any]]:
    events = httpx.get(url + "/status", timeout=10).json()["events"]
    return [e for e in events if e["kind"] == "release"]


def test_a_budget_too_small_stops_the_evicted_and_the_idle_instead_of_sleeping(
    tmp_path: Path,
) -> None:
    yaml, ports = models(tmp_path / "sim-gpu", budget_mib=500)
    with gateway_process(yaml) as gw:
        ask(gw.url, "a-model")
        assert state(gw.url, "a")["sleep_mode"] is True
        ask(gw.url, "b-model")  # a is evicted for b: over the budget, so stopped
        assert state(gw.url, "a")["state"] == "stopped"
        until_sync(lambda: not port_is_open(ports["a"]), what="a's process to exit")
        evicted = next(e for e in releases(gw.url) if e["backend"] == "a")
        assert evicted["cause"] == "eviction"
        assert evicted["reason"] == "stop: weights (1,000 MiB) exceed the host RAM budget (500 MiB)"
        # b goes idle: stopped too, not put to sleep.
        until_sync(lambda: state(gw.url, "b")["state"] == "stopped", what="b stopped when idle")
        until_sync(lambda: not port_is_open(ports["b"]), what="b's process to exit")
        idle = next(e for e in releases(gw.url) if e["backend"] == "b")
        assert (idle["cause"], idle["method"]) == ("idle", "stop")
        assert "host RAM budget" in gw.log()


def test_with_room_in_the_budget_the_evicted_one_sleeps_at_level_1(tmp_path: Path) -> None:
    yaml, ports = models(tmp_path / "sim-gpu", budget_mib=4000)
    with gateway_process(yaml) as gw:
        ask(gw.url, "a-model")
        ask(gw.url, "b-model")
        view = state(gw.url, "a")
        assert (view["state"], view["asleep_level"]) == ("sleeping", 1)
        assert port_is_open(ports["a"])  # the process stays
        ram = httpx.get(gw.url + "/status", timeout=10).json()["host_ram"]
        assert (ram["budget_mib"], ram["charged_mib"]) == (4000, 1000)
