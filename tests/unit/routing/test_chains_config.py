"""`cloud_providers.yaml`: the schema, the cross-checks with `models.yaml` (errors naming
file, key and problem), chain resolution, and the small pure helpers of the chain."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from app.api.views import fallback_view
from app.metrics import Metrics
from app.routing.chains import Passed, fallbacks_header
from app.routing.cloud import Chain, build_cloud
from app.routing.policy import FallbackReason as R
from app.routing.registry import Registry
from app.settings import ConfigError, Settings, load_settings
from app.settings.cloud import ChainConfig, CloudConfig
from app.settings.endpoints import Api
from app.upstreams.usage import usage_in_tail

MODELS = """\
backends:
  reasoning:
    url: http://127.0.0.1:8198
    models: [deepseek-r1-distill-qwen-14b]
    aliases: [reasoning, thinker]
    role: reasoning
  orchestrator:
    url: http://127.0.0.1:8199
    models: [nemotron-8b]
    aliases: [default]
    role: orchestrator
"""
ISSUE_EXAMPLE = """\
providers:
  vast_serverless: {kind: openai, base_url: https://example.invalid/v1, api_key_env: VAST_API_KEY, model: deepseek-r1}
  deepseek: {kind: openai, base_url: https://api.deepseek.com/v1, api_key_env: DEEPSEEK_API_KEY, model: deepseek-reasoner}
  anthropic: {kind: anthropic, base_url: https://api.anthropic.com, api_key_env: ANTHROPIC_API_KEY,
              model: claude-sonnet-4-5, max_tokens: 4096}
chains:
  reasoning: [reasoning, vast_serverless, deepseek, anthropic]
"""  # noqa: E501


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("MICROSCHEDULER_"):
            monkeypatch.delenv(name)


def load(tmp_path: Path, cloud: str) -> Settings:
    (tmp_path / "models.yaml").write_text(MODELS)
    (tmp_path / "cloud_providers.yaml").write_text(cloud)
    return load_settings(tmp_path)


def problem(tmp_path: Path, cloud: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, cloud)
    (line,) = info.value.problems
    prefix = f"{tmp_path / 'cloud_providers.yaml'}: "
    assert line.startswith(prefix), line
    return line.removeprefix(prefix)


def test_the_issue_example_is_accepted_as_written(tmp_path: Path) -> None:
    cloud = load(tmp_path, ISSUE_EXAMPLE).cloud_providers
    assert cloud is not None
    assert cloud.chains["reasoning"].entries == [
        "reasoning",
        "vast_serverless",
        "deepseek",
        "anthropic",
    ]
    chain = cloud.chains["reasoning"]
    assert (chain.on_context_length, chain.max_attempts, chain.wake_timeout_s) == ("relay", 3, 10)
    anthropic = cloud.providers["anthropic"]
    assert (anthropic.kind, anthropic.max_tokens, anthropic.anthropic_version) == (
        "anthropic",
        4096,
        "2023-06-01",
    )


def test_the_long_form_carries_the_chain_options(tmp_path: Path) -> None:
    cloud = load(
        tmp_path,
        ISSUE_EXAMPLE
        + "  default:\n    entries: [orchestrator, deepseek]\n    on_context_length: next\n"
        "    wake_timeout_s: 0\n    deadline_s: 30\n    max_attempts: 2\n"
        "    fallback_on_status: [408, 429]\ncircuit: {failure_threshold: 5, cooldown_s: 12}\n",
    ).cloud_providers
    assert cloud is not None
    assert cloud.chains["default"] == ChainConfig(
        entries=["orchestrator", "deepseek"],
        on_context_length="next",
        wake_timeout_s=0,
        deadline_s=30,
        max_attempts=2,
        fallback_on_status=[408, 429],
    )
    assert (cloud.circuit.failure_threshold, cloud.circuit.cooldown_s) == (5, 12)


@pytest.mark.parametrize(
    ("cloud", "expected"),
    [
        (
            ISSUE_EXAMPLE.replace("[reasoning, vast_serverless", "[reasoning, vast"),
            "chains.reasoning.entries.1: 'vast' is neither a backend in models.yaml "
            "(reasoning, orchestrator) nor a provider (vast_serverless, deepseek, anthropic)",
        ),
        (
            ISSUE_EXAMPLE.replace("  reasoning: [", "  reasoner: ["),
            "chains.reasoner: names no backend role, model id or alias in models.yaml",
        ),
        (
            ISSUE_EXAMPLE.replace("  deepseek: {", "  orchestrator: {"),
            "providers.orchestrator: is also the name of a backend in models.yaml; names must "
            "differ",
        ),
        (
            ISSUE_EXAMPLE.replace(", max_tokens: 4096", ""),
            "providers.anthropic: max_tokens: is required for kind anthropic",
        ),
        (
            ISSUE_EXAMPLE.replace("https://api.anthropic.com,", "https://api.anthropic.com/v1,"),
            "providers.anthropic: base_url: is Anthropic's base URL without /v1",
        ),
        (
            ISSUE_EXAMPLE.replace("https://api.deepseek.com/v1", "api.deepseek.com"),
            "providers.deepseek.base_url: must be an http(s) URL",
        ),
        (
            ISSUE_EXAMPLE.replace(
                "kind: openai, base_url: https://api", "kind: gemini, base_url: https://api"
            ),
            "providers.deepseek.kind: Input should be 'openai' or 'anthropic'",
        ),
        (
            ISSUE_EXAMPLE.replace("model: deepseek-r1}", "model: deepseek-r1, timeout: 3}"),
            "providers.vast_serverless.timeout: unknown key",
        ),
        (
            ISSUE_EXAMPLE.replace(
                "model: deepseek-r1}", "model: deepseek-r1, headers: {Authorization: x}}"
            ),
            "providers.vast_serverless.headers: may not set Authorization",
        ),
        (
            ISSUE_EXAMPLE.replace(
                "[reasoning, vast_serverless, deepseek", "[reasoning, deepseek, deepseek"
            ),
            "chains.reasoning.entries: 'deepseek' is listed twice",
        ),
        (
            ISSUE_EXAMPLE.replace("model: deepseek-r1}", "model: deepseek-r1, max_tokens: 10}"),
            "providers.vast_serverless: max_tokens: only applies to kind anthropic",
        ),
    ],
)
def test_problems_name_the_file_the_key_and_the_problem(
    tmp_path: Path, cloud: str, expected: str
) -> None:
    assert problem(tmp_path, cloud).startswith(expected)


def test_a_pasted_key_is_refused_without_being_echoed(tmp_path: Path) -> None:
    secret = "sk-ant-api03-abcdef"
    line = problem(tmp_path, ISSUE_EXAMPLE.replace("ANTHROPIC_API_KEY", secret))
    assert line.startswith("providers.anthropic.api_key_env: must be the name of an environment")
    assert secret not in line


def settings_for(cloud: str, tmp_path: Path) -> Settings:
    return load(tmp_path, cloud)


def test_a_name_uses_its_own_chain_before_its_role_chain(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        ISSUE_EXAMPLE + "  thinker: [deepseek, reasoning]\n  default: [orchestrator, deepseek]\n",
    )
    cloud = build_cloud(
        settings,
        Registry.from_backends(settings.backends),
        {},
        Metrics(CollectorRegistry()),
        environ={"DEEPSEEK_API_KEY": "k"},
    )
    keys = {name: chain.key for name, chain in cloud.chain_by_model.items()}
    assert keys == {
        "deepseek-r1-distill-qwen-14b": "reasoning",  # by its backend's role
        "reasoning": "reasoning",  # alias and role alike
        "thinker": "thinker",  # its own chain wins over the role's
        "default": "default",
    }
    assert "nemotron-8b" not in keys  # no chain: relayed exactly as before


def test_providers_without_their_key_are_left_out_and_described(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load(tmp_path, ISSUE_EXAMPLE)
    with caplog.at_level(logging.WARNING):
        cloud = build_cloud(
            settings,
            Registry.from_backends(settings.backends),
            {},
            Metrics(CollectorRegistry()),
            environ={"DEEPSEEK_API_KEY": "sk-deepseek-secret", "VAST_API_KEY": ""},
        )
    assert sorted(cloud.providers) == ["deepseek"]
    assert cloud.missing_keys == {"vast_serverless", "anthropic"}
    described = fallback_view(cloud.status())  # as /status shows it
    assert described["providers"]["deepseek"] == {
        "kind": "openai",
        "base_url": "https://api.deepseek.com/v1",
        "model": "deepseek-reasoner",
        "api_key_env": "DEEPSEEK_API_KEY",
        "key_present": True,
        "active": True,
    }
    assert described["providers"]["anthropic"]["key_present"] is False
    assert described["chains"]["reasoning"]["entries"] == [
        "reasoning",
        "vast_serverless",
        "deepseek",
        "anthropic",
    ]
    assert described["circuits"]["deepseek"]["state"] == "closed"
    assert "sk-deepseek-secret" not in json.dumps(described)
    chain = cloud.chains["reasoning"]
    assert cloud.excluded(chain, (Api.CHAT,)) == {
        "vast_serverless": "no_api_key",
        "anthropic": "no_api_key",
    }
    assert "provider=anthropic variable=ANTHROPIC_API_KEY" in caplog.text


def test_entries_are_excluded_for_apis_they_do_not_serve(tmp_path: Path) -> None:
    settings = load(tmp_path, ISSUE_EXAMPLE)
    cloud = build_cloud(
        settings,
        Registry.from_backends(settings.backends),
        {},
        Metrics(CollectorRegistry()),
        environ={"DEEPSEEK_API_KEY": "a", "VAST_API_KEY": "b", "ANTHROPIC_API_KEY": "c"},
    )
    chain: Chain = cloud.chains["reasoning"]
    assert cloud.excluded(chain, (Api.CHAT,)) == {}
    assert cloud.excluded(chain, (Api.COMPLETIONS,)) == {"anthropic": "unsupported_endpoint"}
    # The generate-runner backend serves no embeddings; neither does Anthropic.
    both = {"reasoning": "unsupported_endpoint", "anthropic": "unsupported_endpoint"}
    assert cloud.excluded(chain, (Api.EMBEDDINGS,)) == both
    # Messages: Anthropic passes it through, the others take it translated to chat.
    assert cloud.excluded(chain, (Api.MESSAGES, Api.CHAT)) == {}
    assert cloud.excluded(chain, (Api.RERANK,)) == {
        "reasoning": "unsupported_endpoint",
        "vast_serverless": "unsupported_endpoint",
        "deepseek": "unsupported_endpoint",
        "anthropic": "unsupported_endpoint",
    }


def test_an_empty_cloud_config_is_valid() -> None:
    assert CloudConfig().chains == {}


def test_the_fallbacks_header_is_short() -> None:
    assert fallbacks_header([]) == b"0"
    assert fallbacks_header([Passed("reasoning", R.LOCAL_STOPPED, "detail is not shown")]) == (
        b"1; reasoning=local_stopped"
    )
    assert fallbacks_header([Passed("a", R.HTTP_5XX), Passed("b", R.CIRCUIT_OPEN)]) == (
        b"2; a=http_5xx; b=circuit_open"
    )


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (b'{"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}', (5, 7)),
        (
            b'data: {"choices":[],"usage": {"prompt_tokens": 3, "completion_tokens": 2, '
            b'"prompt_tokens_details": {"cached_tokens": 1}}}\n\ndata: [DONE]\n\n',
            (3, 2),
        ),
        (b'data: {"choices":[{"delta":{"content":"x"}}],"usage":null}\n\n', None),
        (b'data: {"choices":[{"delta":{"content":"the \\"usage\\" word"}}]}\n\n', None),
        (
            b'{"usage":{"prompt_tokens":1,"completion_tokens":1}} ... "usage":{"prompt_tokens":9,'
            b'"completion_tokens":4}}',
            (9, 4),
        ),
        (b"", None),
        (b'{"usage":{"prompt_tokens":"5","completion_tokens":7}}', None),
        # A Messages answer (passed through, or translated back from chat):
        (b'"stop_reason":"end_turn","usage":{"input_tokens":11,"output_tokens":3}}', (11, 3)),
        (
            b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
            b'"max_tokens"},"usage":{"output_tokens":16,"input_tokens":4}}\n\n'
            b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
            (4, 16),
        ),
    ],
)
def test_usage_is_read_from_the_tail(tail: bytes, expected: tuple[int, int] | None) -> None:
    assert usage_in_tail(tail) == expected


def test_shipped_cloud_configs_are_valid() -> None:
    root = Path(__file__).resolve().parents[3] / "config"
    for directory in (root, root / "demo"):
        settings = load_settings(directory)
        assert settings.cloud_providers is not None
        assert settings.cloud_providers.chains
