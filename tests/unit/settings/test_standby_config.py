"""`lifecycle: standby` in the configuration ("Swap in seconds" item 4): validated like a
lazy backend, and check-config says when a process backend lacks vLLM's sleep mode."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.settings import BackendConfig


def standby(env: dict[str, str] | None = None, flag: bool = True, **fields: Any) -> BackendConfig:
    command = ["vllm", "serve", "m"] + (["--enable-sleep-mode"] if flag else [])
    return BackendConfig.model_validate(
        {
            "url": "http://127.0.0.1:8001",
            "models": ["m"],
            "lifecycle": "standby",
            "vram_mib": 8000,
            "runtime": {
                "kind": "process",
                "command": command,
                "env": {"VLLM_SERVER_DEV_MODE": "1"} if env is None else env,
            },
            **fields,
        }
    )


def test_a_standby_backend_with_sleep_mode_has_no_warning() -> None:
    config = standby(min_resident_s=5)
    assert config.lifecycle == "standby"
    assert config.warnings() == []


def test_check_config_says_when_sleep_mode_is_missing() -> None:
    (warning,) = standby(env={}, flag=False).warnings()
    assert warning.startswith("lifecycle: standby needs vLLM's sleep mode, but ")
    assert "runtime.env does not set VLLM_SERVER_DEV_MODE=1" in warning
    assert "runtime.command lacks --enable-sleep-mode" in warning


def test_a_lazy_backend_gets_no_sleep_mode_warning() -> None:
    config = standby(env={}, flag=False, lifecycle="lazy")
    assert config.warnings() == []


def test_standby_needs_a_runtime_the_gateway_starts() -> None:
    with pytest.raises(ValidationError, match="lifecycle: standby needs a runtime"):
        BackendConfig.model_validate(
            {"url": "http://h:8000", "models": ["m"], "lifecycle": "standby", "vram_mib": 1}
        )


def test_standby_needs_a_footprint() -> None:
    with pytest.raises(ValidationError, match="vram_mib: is required for lifecycle: standby"):
        standby(vram_mib=None)
