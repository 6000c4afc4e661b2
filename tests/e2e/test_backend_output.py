"""Seeing inside a process backend: vLLM's load phases in /status while it starts, a failed
start quoting vLLM's decisive line with a hint, and its output through
`GET /backends/{name}/logs` and `microscheduler logs` (admin only)."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.sim.startup_log import WEIGHTS_GIB
from tests.fakes.processes import ROOT, GatewayProcess, free_port, gateway_process
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

ADMIN_KEY = "admin-key-for-output-tests"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
KEY_ENV = {"MICROSCHEDULER_ADMIN_KEY": ADMIN_KEY}


def backend(port: int, *flags: str) -> dict[str, Any]:
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": ["m"],
        "lifecycle": "lazy",
        "vram_mib": 1000,
        "runtime": {
            "kind": "process",
            "command": ["{python}", "-m", "app.sim.vllm", "--port", str(port), "--model", "m",
                        "--max-model-len", "32768", *flags],
            "cwd": str(ROOT),
            "stop_grace_s": 5,
        },
    }  # fmt: skip


def status_of(gw: GatewayProcess, name: str) -> dict[str, Any]:
    backends = httpx.get(gw.url + "/status", headers=ADMIN, timeout=5).json()["backends"]
    found: dict[str, Any] = next(b for b in backends if b["name"] == name)
    return found


def watch_start(gw: GatewayProcess, name: str) -> list[dict[str, Any]]:
    """Start the backend (in a thread) and poll /status until it is ready: every `load`
    seen while it started, each with `seen_by_s`: seconds from the start's request to the
    answer that showed it."""
    asked = time.monotonic()
    started = threading.Thread(
        target=lambda: httpx.post(f"{gw.url}/backends/{name}/start", headers=ADMIN, timeout=60)
    )
    started.start()
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = status_of(gw, name)
        if status["state"] == "ready":
            assert status["load"] is None  # only while starting
            break
        if status["load"] is not None:
            seen.append({**status["load"], "seen_by_s": time.monotonic() - asked})
        time.sleep(0.05)
    started.join(30)
    return seen


def test_a_start_shows_vllms_phases_and_then_an_eta(tmp_path: Path) -> None:
    port = free_port()
    llm = backend(port, "--print-startup-log", "--startup-delay", "3")
    llm["runtime"]["env"] = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    config = {"backends": {"llm": llm}}
    with gateway_process(config, env=KEY_ENV) as gw:
        first = watch_start(gw, "llm")
        phases = list(dict.fromkeys(load["phase"] for load in first))
        # The phases advance in vLLM's order (the poll may miss a short one).
        order = [
            *("launching", "resolving_config", "starting_engine", "loading_model"),
            *("loading_weights", "profiling", "compiling", "allocating_kv_cache"),
            *("capturing_graphs", "warming_up", "starting_server"),
        ]
        assert phases == [p for p in order if p in phases]
        assert {"loading_weights", "capturing_graphs"} <= set(phases)
        percents = [load["percent"] for load in first]
        assert percents == sorted(percents)
        assert percents[-1] > percents[0]
        assert len(set(percents)) >= 5  # the tqdm bars move it, not only the phases
        assert all(load["eta_s"] is None for load in first)  # never measured before
        # "Model loading took 15.27 GiB ..." on its one GPU: the host RAM a level-1 sleep
        # is charged from now on (the planner's estimate or vram_mib before).
        shown = status_of(gw, "llm")
        last_start_s = shown["last_start_s"]
        assert last_start_s >= 3  # --startup-delay 3
        assert shown["host_ram_charge_from"] == "measured"
        assert shown["host_ram_charge_mib"] == math.ceil(WEIGHTS_GIB * 1024)
        # Its torch.compile, compiled (the cache was empty), while it lasted and after.
        assert shown["last_compile"] == {"compile_s": 11.52, "compile_cache": "miss"}
        late = [load for load in first if load["percent"] >= 80]
        assert late
        assert all(load["compile_cache"] == "miss" for load in late)
        assert first[0]["compile_cache"] is None  # nothing said yet
        httpx.post(f"{gw.url}/backends/llm/stop", headers=ADMIN, timeout=30)
        second = watch_start(gw, "llm")
        # The cache the first start filled serves the second: a hit, a shorter compile.
        assert status_of(gw, "llm")["last_compile"] == {"compile_s": 5.02, "compile_cache": "hit"}
        etas = [load["eta_s"] for load in second]
        assert etas
        assert all(isinstance(eta, int) for eta in etas)
        assert etas == sorted(etas, reverse=True)
        # Counted down from this start's own beginning by the last one's duration: never
        # less than what is left of it when the answer came (rounded), never more than it.
        for load in second:
            assert round(last_start_s - load["seen_by_s"]) - 1 <= load["eta_s"]
            assert load["eta_s"] <= round(last_start_s)
        if second[0]["seen_by_s"] < 1:  # seen early (as almost always): most of it left
            assert etas[0] >= 2


def test_a_failed_kv_cache_check_is_quoted_with_its_hint() -> None:
    port = free_port()
    config = {"backends": {"llm": backend(port, "--fail-kv-cache", "--startup-delay", "0.5")}}
    with gateway_process(config, env=KEY_ENV) as gw:
        response = httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert response.status_code == 503
        message = response.json()["error"]["message"]
        reason = status_of(gw, "llm")["reason"]
    vllm_said = (
        "ValueError: To serve at least one request with the model's max seq len (32768), "
        "(4.0 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(1.2 GiB)."
    )
    for text in (message, reason):
        assert "exited with code 1 before it was ready" in text
        assert text.endswith("(its output: `microscheduler logs llm`)")
        assert vllm_said in text
        assert "microscheduler plan context" in text
        assert "--max-model-len" in text
        assert "(EngineCore_DP0 pid=" not in text  # the message, without vLLM's prefix
        assert "Traceback" not in text  # only the decisive line
    assert len(reason) < 1200


def test_the_logs_of_a_process_backend_admin_only_and_followed() -> None:
    port = free_port()
    config = {"backends": {"llm": backend(port, "--print-startup-log", "--startup-delay", "2")}}
    with gateway_process(config, env=KEY_ENV) as gw:
        refused = httpx.get(f"{gw.url}/backends/llm/logs")
        assert refused.status_code == 401
        # Followed from before the start: lines come while it still starts.
        got: list[tuple[float, str]] = []
        ended = threading.Event()

        def follow() -> None:
            url = f"{gw.url}/backends/llm/logs?follow=1&tail=0"
            with httpx.stream("GET", url, headers=ADMIN, timeout=30) as stream:
                assert stream.headers["content-type"].startswith("text/plain")
                for chunk in stream.iter_text():
                    got.append((time.monotonic(), chunk))
            ended.set()

        # Nothing runs yet: a followed output of a stopped backend ends at once.
        follow()
        assert got == []
        assert ended.is_set()
        ended.clear()
        with contextlib.suppress(httpx.ReadTimeout):  # it waits for the start: not here
            httpx.post(f"{gw.url}/backends/llm/start", headers=ADMIN, timeout=0.5)
        reader = threading.Thread(target=follow)
        reader.start()
        until_sync(lambda: any("Loading safetensors" in c for _, c in got), timeout_s=10)
        assert status_of(gw, "llm")["state"] == "starting"  # arrived while it loads
        until_sync(lambda: status_of(gw, "llm")["state"] == "ready", timeout_s=20)
        assert not ended.is_set()  # it serves: the stream stays open
        httpx.post(f"{gw.url}/backends/llm/stop", headers=ADMIN, timeout=30)
        reader.join(10)
        assert ended.is_set()  # the server exited: the stream ended
        text = "".join(c for _, c in got)
        assert "Starting vLLM server on" in text
        assert "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|" in text
        tail = httpx.get(f"{gw.url}/backends/llm/logs?tail=2", headers=ADMIN, timeout=5)
        assert tail.status_code == 200
        assert len(tail.text.splitlines()) == 2
        assert "shutting down" in tail.text
        cli = subprocess.run(
            [sys.executable, "-m", "app.cli", "logs", "llm", "--tail", "3", "--url", gw.url],
            cwd=ROOT, env={**os.environ, **KEY_ENV}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout.splitlines()[-1:] == tail.text.splitlines()[-1:]
        print(f"--- GET /backends/llm/logs?tail=2\n{tail.text}--- microscheduler logs llm "
              f"--tail 3\n{cli.stdout}")  # fmt: skip
        bad = httpx.get(f"{gw.url}/backends/llm/logs?tail=-1", headers=ADMIN, timeout=5)
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "tail"
        assert httpx.get(f"{gw.url}/backends/nope/logs", headers=ADMIN).status_code == 404
