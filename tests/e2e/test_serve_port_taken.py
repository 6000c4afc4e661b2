"""A second `microscheduler serve` on a port a running gateway holds (a second `make run`)
fails at once on the address, exit 1, before it starts any backend: no backend state, no
VRAM refusal in its log, and the first gateway and its backends are left alone. The error
says what holds the port and the ways to another one.

And the port `make run` serves on without PORT=: `serve` without --port (as `make run`
runs it) listens on MICROSCHEDULER_PORT, else `port:` of models.yaml, and its banner
(`--banner`) shows that port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from tests.fakes.processes import ROOT, free_port, gateway_process, sim_gpu_models
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e


def test_a_second_gateway_on_a_taken_port_fails_before_starting_anything(
    tmp_path: Path,
) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    models = sim_gpu_models(tmp_path / "ledger")
    (config_dir / "models.yaml").write_text(yaml.safe_dump(models, sort_keys=False))
    with gateway_process(config_dir=config_dir, wait_ready=True) as first:
        port = urlsplit(first.url).port
        assert port is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
        env["MICROSCHEDULER_STATE_DIR"] = str(tmp_path / "second-var")
        second = subprocess.run(
            [sys.executable, "-m", "app.cli", "serve", "--config", str(config_dir),
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        output = second.stdout + second.stderr
        assert second.returncode == 1, output
        assert f"error: serve: cannot listen on 127.0.0.1:{port}: " in second.stderr
        assert "address already in use" in second.stderr.lower()
        assert "it is held by another microscheduler, by its answer to GET /health" in (
            second.stderr
        )
        assert f"stop what holds port {port}, or choose another port: --port N, " in second.stderr
        assert "MICROSCHEDULER_PORT=N" in second.stderr
        assert "make run PORT=N" in second.stderr
        assert "backend state" not in output  # nothing was started
        assert "VRAM" not in output
        assert "Traceback" not in output
        # The first gateway still serves, its pinned backend still up.
        assert httpx.get(first.url + "/ready", timeout=10).status_code == 200


def test_a_second_gateway_on_the_same_state_directory_refuses_to_start(tmp_path: Path) -> None:
    # Two gateways on one state directory stopped (or adopted and stopped) each other's
    # backends: the second refuses, naming the first's pid and address.
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    models = sim_gpu_models(tmp_path / "ledger")
    (config_dir / "models.yaml").write_text(yaml.safe_dump(models, sort_keys=False))
    state_dir = tmp_path / "var"
    with gateway_process(config_dir=config_dir, wait_ready=True, state_dir=state_dir) as first:
        port = urlsplit(first.url).port
        env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
        env["MICROSCHEDULER_STATE_DIR"] = str(state_dir)
        second = subprocess.run(
            [sys.executable, "-m", "app.cli", "serve", "--config", str(config_dir),
             "--host", "127.0.0.1", "--port", str(free_port())],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        output = second.stdout + second.stderr
        assert second.returncode == 1, output
        assert f"error: serve: the state directory {state_dir} is in use by another gateway " in (
            second.stderr
        )
        assert f"(pid {first.proc.pid}, listening on 127.0.0.1:{port}, since " in second.stderr
        assert "backend state" not in output  # nothing was started, nothing stopped
        assert "Traceback" not in output
        assert httpx.get(first.url + "/ready", timeout=10).status_code == 200


def _health(port: int) -> object:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
    except httpx.TransportError:
        return None


EXTERNAL = {
    "backends": {
        "m": {"url": "http://127.0.0.1:9", "models": ["m"], "runtime": {"kind": "external"}},
    },
}


@pytest.mark.parametrize("source", ["environment", "models.yaml"])
def test_serve_without_port_listens_where_the_settings_say_and_its_banner_says_so(
    tmp_path: Path, source: str
) -> None:
    port = free_port()
    models: dict[str, object] = dict(EXTERNAL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    env["MICROSCHEDULER_STATE_DIR"] = str(tmp_path / "var")
    if source == "environment":
        env["MICROSCHEDULER_PORT"] = str(port)
        models["port"] = 1  # the environment wins over the file
    else:
        models["port"] = port
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(models))
    # As `make run` runs it (the Makefile's line: no --host/--port without HOST=/PORT=).
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--config", str(tmp_path), "--banner"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first == (
            f"microscheduler: serving {tmp_path} on http://127.0.0.1:{port} "
            "(Ctrl-C stops it and its backends).\n"
        )
        rest = [proc.stdout.readline() for _ in range(3)]
        assert f"curl -sN http://127.0.0.1:{port}/v1/chat/completions" in rest[-1]
        # The banner comes once the address is bound; it listens once the start-up is done.
        assert until_sync(lambda: _health(port), timeout_s=60, what="the gateway serving") == {
            "status": "ok"
        }
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
