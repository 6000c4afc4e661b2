"""Real processes on 127.0.0.1 for end-to-end tests: the fake vLLM and the gateway."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from tests.fakes.waits import until_sync

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def as_foreground_job() -> None:
    """`preexec_fn` of a process the test stops with SIGINT, as Ctrl-C stops a command run
    in a terminal: SIGINT at its default. A shell starts a background job (`make test &`)
    with SIGINT ignored, its children inherit that, and Python then installs no
    KeyboardInterrupt handler, so the signal would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(url: str, *, timeout_s: float, status: int = 200, proc: Any = None) -> None:
    """Until `url` answers `status`; fails at once if `proc` exits first."""
    last: list[str] = ["no answer"]

    def answers() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            response = httpx.get(url, timeout=1)
        except httpx.HTTPError as exc:
            last[0] = type(exc).__name__
            return False
        last[0] = f"status {response.status_code}"
        return response.status_code == status

    until_sync(answers, timeout_s=timeout_s, what=lambda: f"{url} to answer {status} ({last[0]})")


def stop(proc: subprocess.Popen[bytes], *, timeout_s: float = 15) -> int:
    """SIGTERM, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


@contextlib.contextmanager
def fake_vllm_process(
    model: str, *flags: str, port: int | None = None, env: dict[str, str] | None = None
) -> Iterator[str]:
    """A fake vLLM process (`env` added to its environment); yields its base URL once
    /health answers."""
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.sim.vllm", "--port", str(port), "--model", model, *flags],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/health", timeout_s=20, proc=proc)
        yield url
    finally:
        stop(proc)


class GatewayProcess:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


# The host RAM a gateway process reads (`host_ram.sim`, through the environment like any
# key) unless its models.yaml says its own: the same on every machine, roomy so a level-1
# sleep fits (the in-process gateways' `TEST_RAM_*`), never /proc/meminfo.
SIM_RAM_ENV = "MICROSCHEDULER_HOST_RAM__SIM"
SIM_RAM = '{"total_mib": 65536, "available_mib": 40960}'


def _sets_sim_ram(models_yaml: Path) -> bool:
    config = yaml.safe_load(models_yaml.read_text()) if models_yaml.exists() else None
    host_ram = config.get("host_ram") if isinstance(config, dict) else None
    return isinstance(host_ram, dict) and host_ram.get("sim") is not None


@contextlib.contextmanager
def gateway_process(
    models_yaml: dict[str, Any] | None = None,
    *,
    config_dir: Path | None = None,
    env: dict[str, str] | None = None,
    wait_ready: bool = False,
    state_dir: Path | None = None,
    args: Sequence[str] = (),
) -> Iterator[GatewayProcess]:
    """`microscheduler serve` as a real uvicorn process on a free port of 127.0.0.1.
    `state_dir`: its state directory (default: a fresh one, removed afterwards). Its host
    RAM is `SIM_RAM` unless models.yaml has `host_ram.sim` (`env` may override it too)."""
    with tempfile.TemporaryDirectory() as tmp:
        if config_dir is None:
            config_dir = Path(tmp) / "config"
            config_dir.mkdir()
            (config_dir / "models.yaml").write_text(yaml.safe_dump(models_yaml, sort_keys=False))
        port = free_port()
        log_path = Path(tmp) / "gateway.log"
        clean_env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
        clean_env["MICROSCHEDULER_STATE_DIR"] = str(state_dir or f"{tmp}/var")
        if not _sets_sim_ram(config_dir / "models.yaml"):
            clean_env[SIM_RAM_ENV] = SIM_RAM
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve", "--config", str(config_dir),
                 "--host", "127.0.0.1", "--port", str(port), *args],
                cwd=ROOT,
                env={**clean_env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        gateway = GatewayProcess(proc, f"http://127.0.0.1:{port}", log_path)
        try:
            try:
                wait_for(gateway.url + "/health", timeout_s=20, proc=proc)
                if wait_ready:
                    wait_for(gateway.url + "/ready", timeout_s=30, proc=proc)
            except (RuntimeError, AssertionError) as exc:
                raise RuntimeError(f"{exc}; its log:\n{gateway.log()[-4000:]}") from None
            yield gateway
        finally:
            stop(proc)


def sim_gpu_models(ledger: Path, *, pinned_mib: int = 8000, lazy_mib: int = 6000) -> dict[str, Any]:
    """models.yaml for a gateway process on a simulated 24 GiB GPU: a pinned and a lazy
    fake vLLM process on free ports, both reporting their memory to `ledger`."""

    def fake(port: int, model: str, mib: int) -> dict[str, Any]:
        return {
            "kind": "process",
            "command": ["{python}", "-m", "app.sim.vllm", "--port", str(port), "--model", model,
                        "--startup-delay", "0.5", "--vram-mib", str(mib),
                        "--sim-gpu-dir", str(ledger)],
        }  # fmt: skip

    pinned, lazy = free_port(), free_port()
    return {
        "gpu": {"probe": "sim", "poll_interval_s": 0.5,
                "sim": {"total_mib": 24576, "ledger_dir": str(ledger)}},
        "backends": {
            "pinned": {"url": f"http://127.0.0.1:{pinned}", "models": ["pinned-model"],
                       "priority": 90, "vram_mib": pinned_mib,
                       "runtime": fake(pinned, "pinned-model", pinned_mib)},
            "lazy": {"url": f"http://127.0.0.1:{lazy}", "models": ["lazy-model"],
                     "lifecycle": "lazy", "vram_mib": lazy_mib,
                     "runtime": fake(lazy, "lazy-model", lazy_mib)},
        },
    }  # fmt: skip


def two_host_models(ledger: Path, remote_url: str, *, remote_mib: int = 12000) -> dict[str, Any]:
    """`sim_gpu_models` and a second machine, `node-c`, with a simulated 32 GiB GPU of its
    own, where the backend `remote` (an external fake vLLM at `remote_url`, serving
    remote-model) holds `remote_mib`, as placed (node-c's GPU has no ledger)."""
    models = sim_gpu_models(ledger)
    models["hosts"] = {"node-c": {"gpu": {"probe": "sim", "poll_interval_s": 0.5}}}
    models["backends"]["remote"] = {
        "url": remote_url, "models": ["remote-model"], "host": "node-c",
        "vram_mib": remote_mib, "runtime": {"kind": "external"},
    }  # fmt: skip
    return models
