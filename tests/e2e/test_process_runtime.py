"""`runtime: {kind: process}` for real: started with the gateway, stopped (whole group) with it."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.processes import (
    ROOT,
    GatewayProcess,
    free_port,
    gateway_process,
    port_is_open,
    stop,
)
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e


def demo_config(tmp_path: Path) -> tuple[Path, int, int]:
    """config/demo as shipped, on free ports and its own GPU ledger: the test runs beside
    `make run` (which holds 8198, 8199 and var/sim-gpu)."""
    orchestrator, reasoning = free_port(), free_port()
    target = tmp_path / "demo"
    shutil.copytree(ROOT / "config" / "demo", target)
    models = (target / "models.yaml").read_text()
    models = models.replace("8199", str(orchestrator)).replace("8198", str(reasoning))
    models = models.replace("var/sim-gpu", str(tmp_path / "sim-gpu"))
    (target / "models.yaml").write_text(models)
    return target, orchestrator, reasoning


def test_demo_config_wakes_the_lazy_backend_and_stops_both(tmp_path: Path) -> None:
    config, orchestrator, reasoning = demo_config(tmp_path)
    with gateway_process(config_dir=config, wait_ready=True) as gw:
        assert port_is_open(orchestrator)  # pinned: started with the gateway
        assert not port_is_open(reasoning)  # lazy: until a request wakes it
        with openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as client:
            for model in ("default", "reasoning"):
                reply = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=2,
                )
                assert reply.choices[0].message.content
        assert port_is_open(reasoning)
        claude_code_is_served(gw.url)
        # The default yield frees what the woken lazy backend holds, as measured: asleep,
        # the fake keeps an eighth of its 11000 MiB.
        taken = httpx.post(gw.url + "/vram/yield", json={"reason": "gaming"}, timeout=60).json()
        assert (taken["slept"], taken["freed_mib"]) == (["reasoning"], 9625)
        httpx.post(gw.url + "/vram/restore", timeout=60)
        assert_clean_exit(stop(gw.proc))
        log = gw.log()
    assert "Application shutdown complete." in log
    assert not port_is_open(orchestrator)
    assert not port_is_open(reasoning)
    assert "process stopped backend=orchestrator" in log
    assert "process stopped backend=reasoning" in log


def claude_code_is_served(url: str) -> None:
    """The README's Claude Code example works on the demo: a request Claude Code sent (it
    always sends tools), passed through (`reasoning`) and translated (`default`), is
    answered; the demo's fakes run with --enable-auto-tool-choice --tool-call-parser, as a
    real vLLM must (without them: 400)."""
    recorded = json.loads((ROOT / "tests" / "fixtures" / "claude_code_messages.json").read_text())
    for model in ("reasoning", "default"):
        body = {**recorded["body"], "model": model, "stream": False}
        answer = httpx.post(url + "/v1/messages", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["type"] == "message"


def assert_clean_exit(code: int) -> None:
    # uvicorn re-raises the SIGTERM it handled after a clean shutdown: -15 is its normal exit.
    assert code in (0, -signal.SIGTERM)


def fake_backend(port: int, *flags: str, grace: float = 10) -> dict[str, object]:
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": ["m"],
        "runtime": {
            "kind": "process",
            "command": ["{python}", "-m", "app.sim.vllm", "--port", str(port),
                        "--model", "m", *flags],
            "cwd": str(ROOT),
            "stop_grace_s": grace,
        },
    }  # fmt: skip


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    port = free_port()
    config = {"backends": {"stubborn": fake_backend(port, "--ignore-sigterm", grace=1)}}
    with gateway_process(config, wait_ready=True) as gw:
        assert port_is_open(port)
        began = time.monotonic()
        assert_clean_exit(stop(gw.proc))
        took = time.monotonic() - began
        log = gw.log()
    assert not port_is_open(port)
    assert "process ignored SIGTERM, killing backend=stubborn" in log
    assert 1 <= took < 10


def failed_backend(gw: GatewayProcess, name: str) -> dict[str, Any] | None:
    backend: dict[str, Any] = httpx.get(gw.url + "/ready").json()["backends"][name]
    return backend if backend["state"] == "failed" else None


def test_a_command_that_exits_is_reported_with_its_exit_code(tmp_path: Path) -> None:
    config = {
        "backends": {
            "broken": {
                "url": f"http://127.0.0.1:{free_port()}",
                "models": ["m"],
                "runtime": {
                    "kind": "process",
                    "command": ["{python}", "-c", "raise SystemExit(3)"],
                },
            }
        }
    }
    with gateway_process(config) as gw:
        backend = until_sync(lambda: failed_backend(gw, "broken"))
        assert backend["state"] == "failed"
        # Nothing in its output explains it: the reason says where to read the rest.
        assert backend["reason"] == (
            "exited with code 3 before it was ready (its output: `microscheduler logs broken`)"
        )
        response = httpx.post(gw.url + "/v1/chat/completions", json={"model": "m", "messages": []})
        assert response.status_code == 503
        assert "exited with code 3" in response.json()["error"]["message"]


def test_a_missing_command_is_a_clear_failure() -> None:
    config = {
        "backends": {
            "missing": {
                "url": f"http://127.0.0.1:{free_port()}",
                "models": ["m"],
                "runtime": {"kind": "process", "command": ["/nonexistent/vllm", "serve"]},
            }
        }
    }
    with gateway_process(config) as gw:
        backend = until_sync(lambda: failed_backend(gw, "missing"))
    assert backend["reason"] == (
        "backends.missing.runtime.command: cannot run '/nonexistent/vllm': "
        "No such file or directory"
    )
