"""What a process backend inherits: the gateway's environment minus every secret the
configuration names, plus its own `env:`."""

from __future__ import annotations

import os
from typing import Any

import pytest

from app.runtimes.child_env import child_environment, secret_variables
from app.settings import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MICROSCHEDULER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AGENTS_KEY", "sk-agents")  # keys.yaml checks it is set


def process(port: int, **fields: Any) -> dict[str, Any]:
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": [f"m{port}"],
        "runtime": {"kind": "process", "command": ["vllm", "serve"], **fields},
    }


def settings() -> Settings:
    return Settings(
        backends={
            "local": {**process(8001, env={"OWN": "mine", "HF_HOME": "/models"}),
                      "api_key_env": "LOCAL_VLLM_KEY"},
            "other": {**process(8002), "api_key_env": "OTHER_VLLM_KEY"},
        },
        cloud_providers={
            "providers": {
                "deepseek": {"kind": "openai", "base_url": "https://api.deepseek.com/v1",
                             "api_key_env": "DEEPSEEK_API_KEY", "model": "deepseek-chat"},
            },
        },
        client_keys={"keys": {"agents": {"key_env": "AGENTS_KEY"}}},
        hosts={"node-c": {"gpu": {"probe": "prometheus", "prometheus": {
            "url": "http://prom:9090", "bearer_token_env": "PROM_TOKEN"}}}},
    )  # fmt: skip


GATEWAY_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/gw",
    "CUDA_VISIBLE_DEVICES": "0",
    "HF_HOME": "/cache",
    "LOCAL_VLLM_KEY": "sk-local",
    "OTHER_VLLM_KEY": "sk-other",
    "DEEPSEEK_API_KEY": "sk-deepseek",
    "AGENTS_KEY": "sk-agents",
    "PROM_TOKEN": "prom-token",
    "MICROSCHEDULER_ADMIN_KEY": "admin-secret",
    "MICROSCHEDULER_API_KEYS": "sk-a,sk-b",
    "microscheduler_api_keys": "lower-case too",
}


def test_every_configured_secret_variable_is_found() -> None:
    assert secret_variables(settings()) == {
        "LOCAL_VLLM_KEY",
        "OTHER_VLLM_KEY",
        "DEEPSEEK_API_KEY",
        "AGENTS_KEY",
        "PROM_TOKEN",
    }


def test_a_backend_gets_the_environment_without_the_secrets_plus_its_own_env() -> None:
    env = child_environment(settings(), "local", GATEWAY_ENV)
    assert env == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/gw",
        "CUDA_VISIBLE_DEVICES": "0",
        "HF_HOME": "/models",  # its own env: wins
        "OWN": "mine",
        "LOCAL_VLLM_KEY": "sk-local",  # its own server's key: the server checks it
    }


def test_a_backend_never_sees_another_backends_key() -> None:
    env = child_environment(settings(), "other", GATEWAY_ENV)
    assert "LOCAL_VLLM_KEY" not in env
    assert env["OTHER_VLLM_KEY"] == "sk-other"
    assert not {"DEEPSEEK_API_KEY", "AGENTS_KEY", "PROM_TOKEN", "OWN"} & env.keys()
    assert not [name for name in env if name.upper().startswith("MICROSCHEDULER_")]
