"""A process backend's environment, read from /proc/PID/environ of the real server: the
gateway's secrets are not in it; PATH and its own `env:` are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.processes import ROOT, free_port, gateway_process
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

ADMIN = "admin-secret-for-the-env-test"
SECRETS = {
    "MICROSCHEDULER_ADMIN_KEY": ADMIN,
    "MICROSCHEDULER_API_KEYS": "sk-client-env-test",
    "OTHER_BACKEND_KEY": "sk-other-backend",
    "LOCAL_KEY": "sk-its-own",
}


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_a_process_backend_inherits_no_secret_of_the_gateway() -> None:
    port = free_port()
    config: dict[str, Any] = {
        "backends": {
            "local": {
                "url": f"http://127.0.0.1:{port}",
                "models": ["m"],
                "api_key_env": "LOCAL_KEY",
                "runtime": {
                    "kind": "process",
                    "command": ["{python}", "-m", "app.sim.vllm", "--port", str(port),
                                "--model", "m"],
                    "cwd": str(ROOT),
                    "env": {"OWN_SETTING": "42"},
                },
            },
            "other": {
                "url": f"http://127.0.0.1:{free_port()}",
                "models": ["other"],
                "lifecycle": "lazy",
                "vram_mib": 1000,
                "api_key_env": "OTHER_BACKEND_KEY",
                "runtime": {"kind": "process", "command": ["{python}", "-c", "pass"]},
            },
        }
    }  # fmt: skip
    with gateway_process(config, env=SECRETS, wait_ready=True) as gw:
        admin = {"authorization": f"Bearer {ADMIN}"}

        def pid() -> int | None:
            listed = httpx.get(gw.url + "/backends", headers=admin, timeout=5).json()
            status = next(b for b in listed["backends"] if b["name"] == "local")
            detail = status["runtime_detail"] or ""
            return int(detail.split()[1]) if detail.startswith("pid ") else None

        env = environ_of(until_sync(pid, what="the backend's pid in runtime_detail"))
    assert "PATH" in env
    assert env["OWN_SETTING"] == "42"
    assert env["LOCAL_KEY"] == "sk-its-own"  # its own server's key, which it checks
    assert "OTHER_BACKEND_KEY" not in env
    assert not [name for name in env if name.startswith("MICROSCHEDULER_")]
    assert not [name for name, value in env.items() if value in SECRETS.values()
                and name != "LOCAL_KEY"]  # fmt: skip
