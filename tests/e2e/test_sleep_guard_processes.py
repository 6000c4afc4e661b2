"""The sleep guard for real: a gateway process, a fake vLLM process that leaks over
sleep/wake cycles (`--sleep-leak-mib`) on a simulated GPU, and the openai SDK as the
client. The leaking server's process is stopped at the sleep that holds more than
`sleep_leak_mib` over its first, and the next request starts a new process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.processes import free_port, gateway_process, port_is_open
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e


def models(ledger: Path, port: int) -> dict[str, Any]:
    """One lazy fake (4000 MiB awake, 500 asleep, 300 more asleep each cycle) put to sleep
    at level 1 after 0.5 s idle, on a 32768 MiB simulated GPU."""
    backend = {
        "url": f"http://127.0.0.1:{port}", "models": ["leaky"], "lifecycle": "lazy",
        "vram_mib": 4000, "idle_ttl_s": 0.5, "idle": {"method": "sleep", "level": 1},
        "sleep_mode": True,  # sleep_leak_mib: 512, the default
        "runtime": {
            "kind": "process", "env": {"VLLM_SERVER_DEV_MODE": "1"},
            "command": ["{python}", "-m", "app.sim.vllm", "--port", str(port),
                        "--model", "leaky", "--vram-mib", "4000", "--vram-asleep-mib", "500",
                        "--sleep-leak-mib", "300", "--sim-gpu-dir", str(ledger)],
        },
    }  # fmt: skip
    return {
        "gpu": {"probe": "sim", "poll_interval_s": 0.2,
                "sim": {"total_mib": 32768, "ledger_dir": str(ledger)}},
        "host_ram": {"sleep_budget_mib": 8000, "reserve_mib": 0},
        "reaper_interval_s": 0.2,
        "backends": {"leaky": backend},
    }  # fmt: skip


def ask(url: str) -> None:
    with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(
            model="leaky", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert reply.choices[0].message.content


def view(url: str) -> dict[str, Any]:
    views = httpx.get(url + "/backends", timeout=10).json()["backends"]
    found: dict[str, Any] = next(v for v in views if v["name"] == "leaky")
    return found


def pid(port: int) -> int:
    value: int = httpx.get(f"http://127.0.0.1:{port}/_fake/stats", timeout=10).json()["pid"]
    return value


def test_a_leaking_server_is_stopped_and_its_next_request_starts_a_new_one(
    tmp_path: Path,
) -> None:
    port = free_port()
    with gateway_process(models(tmp_path / "sim-gpu", port)) as gw:
        ask(gw.url)
        first = pid(port)
        for held in (500, 800):  # within 512 MiB of the first sleep: it sleeps
            until_sync(lambda: view(gw.url)["state"] == "sleeping", what="the idle sleep")
            assert view(gw.url)["asleep_mib"] == held
            ask(gw.url)  # woken: the same process
            assert pid(port) == first
        until_sync(lambda: view(gw.url)["state"] == "stopped", what="the guard's stop")
        until_sync(lambda: not port_is_open(port), what="the leaking process to exit")
        stopped = view(gw.url)
        assert stopped["reason"].startswith("sleep guard: held asleep grew 600 MiB"), stopped
        assert stopped["sleeps"]["growth_mib"] == 600
        metrics = httpx.get(gw.url + "/metrics", timeout=10).text
        assert 'microscheduler_sleep_guard_total{backend="leaky",cause="leak"} 1.0' in metrics
        assert "sleep guard stops backend=leaky cause=leak" in gw.log()

        ask(gw.url)  # a cold start: a new process, whose sleeps begin again
        assert pid(port) != first
        assert view(gw.url)["sleeps"]["cycles"] == 0
