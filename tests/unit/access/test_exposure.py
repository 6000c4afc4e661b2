"""Start-up refuses to expose paid providers to anyone, and says what else is left open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.access.auth import exposure_warnings
from app.settings import ConfigError, load_settings

MODELS = """\
backends:
  reasoning: {url: "http://127.0.0.1:8198", models: [r1], role: reasoning}
"""
PAID = """\
providers:
  deepseek: {kind: openai, base_url: https://api.deepseek.com/v1, api_key_env: DEEPSEEK_API_KEY,
             model: deepseek-reasoner}
chains:
  reasoning: [reasoning, deepseek]
"""
KEYLESS = """\
providers:
  lan_vllm: {kind: openai, base_url: http://10.0.0.5:8000/v1, model: qwen}
chains:
  reasoning: [reasoning, lan_vllm]
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MICROSCHEDULER_"):
            monkeypatch.delenv(name)


def load(tmp_path: Path, cloud: str, **env: str) -> None:
    (tmp_path / "models.yaml").write_text(MODELS)
    (tmp_path / "cloud_providers.yaml").write_text(cloud)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        load_settings(tmp_path)


def test_no_key_on_an_open_address_with_a_paid_chain_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, PAID, MICROSCHEDULER_HOST="0.0.0.0")
    (line,) = info.value.problems
    assert "listening on 0.0.0.0 without MICROSCHEDULER_API_KEYS" in line
    assert "(deepseek)" in line
    assert "MICROSCHEDULER_ALLOW_UNAUTHENTICATED=1" in line


@pytest.mark.parametrize(
    "env",
    [
        {"MICROSCHEDULER_HOST": "0.0.0.0", "MICROSCHEDULER_API_KEYS": "k1"},
        {"MICROSCHEDULER_HOST": "0.0.0.0", "MICROSCHEDULER_ALLOW_UNAUTHENTICATED": "1"},
        {"MICROSCHEDULER_HOST": "127.0.0.1"},
        {"MICROSCHEDULER_HOST": "::1"},
        {"MICROSCHEDULER_HOST": "localhost"},
    ],
)
def test_keys_an_explicit_choice_or_loopback_start(tmp_path: Path, env: dict[str, str]) -> None:
    load(tmp_path, PAID, **env)


def test_a_chain_of_keyless_providers_costs_nothing_and_starts(tmp_path: Path) -> None:
    load(tmp_path, KEYLESS, MICROSCHEDULER_HOST="0.0.0.0")


def test_what_an_open_address_leaves_open_is_said() -> None:
    assert exposure_warnings("127.0.0.1", api_keys=False, admin_key=False) == []
    both = exposure_warnings("0.0.0.0", api_keys=False, admin_key=False)
    assert len(both) == 2
    assert "MICROSCHEDULER_API_KEYS" in both[0]
    assert "reverse proxy" in both[1]
    assert "MICROSCHEDULER_ADMIN_KEY" in both[1]
    assert exposure_warnings("0.0.0.0", api_keys=True, admin_key=True) == []
