"""A process backend writing its output as fast as it can (DEBUG logging, prompts echoed, a
crash loop) does not take the gateway down: `/health` answers meanwhile, the output files
stay within the cap, the drops are counted and said in the file, and SIGTERM still stops
the gateway (issue 33; `bench/chatty.py` measures the same at length)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.runtimes.output import FILE_MAX_BYTES
from tests.fakes.processes import ROOT, free_port, gateway_process

pytestmark = pytest.mark.e2e

FLOOD_S = 5.0
HEALTH_BOUND_S = 1.0  # generous: the bench's target is 100 ms


def chatty_backend(port: int) -> dict[str, Any]:
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": ["m"],
        "lifecycle": "lazy",
        "vram_mib": 1000,
        "runtime": {
            "kind": "process",
            # Unpaced for FLOOD_S + 1 s, then it stops its fake vLLM and exits: bounded
            # even if the gateway under test never stops it.
            "command": ["{python}", "-m", "app.sim.chatty", "--mb-per-s", "0",
                        "--seconds", str(FLOOD_S + 1), "--then-exit", "--",
                        "{python}", "-m", "app.sim.vllm", "--port", str(port), "--model", "m"],
            "cwd": str(ROOT),
            "stop_grace_s": 5,
        },
    }  # fmt: skip


def metric(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and 'backend="chatty"' in line
    )


def test_a_chatty_backend_leaves_the_gateway_answering_and_its_files_capped(
    tmp_path: Path,
) -> None:
    state = tmp_path / "var"
    logs = state / "logs"
    config = {"backends": {"chatty": chatty_backend(free_port())}}
    with gateway_process(config, state_dir=state) as gw:

        def start() -> None:
            with contextlib.suppress(httpx.HTTPError):  # its answer is not the point
                httpx.post(f"{gw.url}/backends/chatty/start", timeout=30)

        starter = threading.Thread(target=start, daemon=True)
        began = time.monotonic()
        starter.start()
        slowest = 0.0
        largest = 0
        while time.monotonic() - began < FLOOD_S:
            asked = time.monotonic()
            try:
                health = httpx.get(f"{gw.url}/health", timeout=5)
            except httpx.TimeoutException:
                pytest.fail(f"/health did not answer in 5 s, {asked - began:.1f} s into the flood")
            assert health.status_code == 200
            slowest = max(slowest, time.monotonic() - asked)
            for name in ("chatty.log", "chatty.log.1"):
                if (logs / name).exists():
                    largest = max(largest, (logs / name).stat().st_size)
            time.sleep(0.1)  # the pace of the probe, not a wait for anything
        assert slowest < HEALTH_BOUND_S, f"/health took {slowest:.2f} s during the flood"
        assert largest <= FILE_MAX_BYTES, f"an output file reached {largest} bytes"
        metrics = httpx.get(f"{gw.url}/metrics", timeout=5).text
        assert metric(metrics, "microscheduler_backend_output_dropped_lines_total") > 10_000
        gw.proc.send_signal(signal.SIGTERM)
        gw.proc.wait(30)  # raises when SIGTERM is not honoured
        starter.join(30)
    text = (logs / "chatty.log").read_text(errors="replace")
    if (logs / "chatty.log.1").exists():
        text = (logs / "chatty.log.1").read_text(errors="replace") + text
    assert "[microscheduler] dropped " in text
    assert "the server wrote faster than 1 MiB/s or 10000 lines/s" in text
    for name in ("chatty.log", "chatty.log.1"):
        if (logs / name).exists():
            assert (logs / name).stat().st_size <= FILE_MAX_BYTES
            assert (logs / name).stat().st_mode & 0o777 == 0o600
