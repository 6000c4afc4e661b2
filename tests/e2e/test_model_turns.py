"""Swap in seconds, for real ("Swap in seconds" items 1 and 4): the gateway as a process,
its backends fake vLLM processes in dev mode on a simulated 16,000 MiB GPU.

- Two lazy models of equal priority, 11,000 MiB each, take turns: alternating requests
  are all answered locally (before: the second got 503 backend_no_vram), the evicted one
  is put to sleep (`eviction: {method: sleep}`) and woken as the same process (same pid).
- A standby model is asleep before any request, and its first request wakes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.processes import free_port, gateway_process
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e


def fake(port: int, model: str, ledger: Path, **fields: Any) -> dict[str, Any]:
    command = [
        "{python}", "-m", "app.sim.vllm", "--port", str(port), "--model", model,
        "--vram-mib", "11000", "--vram-asleep-mib", "1000", "--sim-gpu-dir", str(ledger),
        "--max-tokens", "2", "--enable-sleep-mode",
    ]  # fmt: skip
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": [model],
        "lifecycle": "lazy",
        "vram_mib": 11000,
        "asleep_mib": 1000,
        "eviction": {"method": "sleep", "level": 1},
        "runtime": {"kind": "process", "command": command, "env": {"VLLM_SERVER_DEV_MODE": "1"}},
        **fields,
    }


def models_yaml(ledger: Path, backends: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"gpu": {"probe": "sim", "sim": {"total_mib": 16000, "ledger_dir": str(ledger)}},
            "backends": backends}  # fmt: skip


def chat(url: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def fake_stats(port: int) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/_fake/stats", timeout=5).json()
    return stats


def status_of(url: str, name: str) -> dict[str, Any]:
    views: list[dict[str, Any]] = httpx.get(url + "/status", timeout=5).json()["backends"]
    (view,) = (v for v in views if v["name"] == name)
    return view


def test_two_equal_lazy_models_take_turns_and_the_evicted_one_sleeps(tmp_path: Path) -> None:
    ledger = tmp_path / "sim-gpu"
    ports = {"alpha": free_port(), "beta": free_port()}
    backends = {name: fake(port, f"{name}-model", ledger) for name, port in ports.items()}
    with gateway_process(models_yaml(ledger, backends)) as gw:
        pids: dict[str, int] = {}
        for turn in range(6):
            name = ("alpha", "beta")[turn % 2]
            response = chat(gw.url, f"{name}-model")
            assert response.status_code == 200, response.text  # answered locally
            assert response.json()["model"] == f"{name}-model"
            pid = fake_stats(ports[name])["pid"]
            assert pids.setdefault(name, pid) == pid  # woken, not started again
            other = "beta" if name == "alpha" else "alpha"
            if turn:
                assert status_of(gw.url, other)["state"] == "sleeping"
        assert fake_stats(ports["alpha"])["wakes"] == 2  # turns 2 and 4
        assert fake_stats(ports["beta"])["wakes"] == 2  # turns 3 and 5
        assert "more than eviction can free" not in gw.log()


def test_a_standby_model_is_asleep_before_any_request(tmp_path: Path) -> None:
    ledger = tmp_path / "sim-gpu"
    port = free_port()
    backend = fake(port, "standby-model", ledger, lifecycle="standby")
    with gateway_process(models_yaml(ledger, {"ready": backend})) as gw:
        view = until_sync(
            lambda: (v := status_of(gw.url, "ready"))["state"] == "sleeping" and v,
            timeout_s=30,
            what="the standby backend to be asleep",
        )
        assert view["lifecycle"] == "standby"
        assert "asleep (level 1, standby" in view["reason"]
        stats = fake_stats(port)
        assert stats["completed"] == 0  # no request has reached it
        assert stats["wakes"] == 0
        pid = stats["pid"]

        response = chat(gw.url, "standby-model")
        assert response.status_code == 200, response.text
        stats = fake_stats(port)
        assert (stats["pid"], stats["wakes"]) == (pid, 1)  # a wake, not a cold start
        assert status_of(gw.url, "ready")["state"] == "ready"
