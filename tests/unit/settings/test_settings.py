from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from app.settings import (
    BackendConfig,
    ConfigError,
    ExternalRuntimeConfig,
    ProcessRuntimeConfig,
    load_settings,
)
from app.settings.cloud import CloudConfig
from tests.docs import page, section

ISSUE_EXAMPLE = """\
backends:
  orchestrator:
    url: http://127.0.0.1:8199        # base URL of a vLLM OpenAI server (no /v1)
    models: [nemotron-8b]             # ids it serves; the first is the one sent upstream
    aliases: [orchestrator, default]  # more names clients may use
    role: orchestrator
    runtime: {kind: external}         # not managed by us; health-checked only
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("MICROSCHEDULER_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str = "models.yaml") -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path


def problems(tmp_path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path)
    return info.value.problems


def test_issue_example_is_accepted_exactly_as_written(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, ISSUE_EXAMPLE))
    backend = settings.backends["orchestrator"]
    assert backend.url == "http://127.0.0.1:8199"
    assert backend.models == ["nemotron-8b"]
    assert backend.served_model == "nemotron-8b"
    assert backend.aliases == ["orchestrator", "default"]
    assert backend.role == "orchestrator"
    assert isinstance(backend.runtime, ExternalRuntimeConfig)
    assert settings.max_body_bytes == 10 * 1024 * 1024
    assert settings.config_dir == tmp_path


def test_process_runtime_and_defaults(tmp_path: Path) -> None:
    text = ISSUE_EXAMPLE.replace(
        "runtime: {kind: external}",
        'runtime: {kind: process, command: ["{python}", "-V"], env: {A: "1"}}',
    )
    runtime = load_settings(write(tmp_path, text)).backends["orchestrator"].runtime
    assert isinstance(runtime, ProcessRuntimeConfig)
    assert runtime.command == ["{python}", "-V"]
    assert runtime.env == {"A": "1"}
    assert runtime.stop_grace_s == 10.0


def test_environment_overrides_yaml_including_nested_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, ISSUE_EXAMPLE + "timeouts: {connect_s: 3, idle_s: 30}\n")
    monkeypatch.setenv("MICROSCHEDULER_TIMEOUTS__CONNECT_S", "1.5")
    monkeypatch.setenv("MICROSCHEDULER_MAX_BODY_BYTES", "1000")
    settings = load_settings(tmp_path)
    assert settings.timeouts.connect_s == 1.5
    assert settings.timeouts.idle_s == 30  # the YAML value of a sibling key survives
    assert settings.max_body_bytes == 1000


def test_backend_timeout_overrides_merge_over_global(tmp_path: Path) -> None:
    text = ISSUE_EXAMPLE + "    timeouts: {idle_s: 5}\ntimeouts: {connect_s: 2}\n"
    settings = load_settings(write(tmp_path, text))
    merged = settings.backend_timeouts("orchestrator")
    assert (merged.connect_s, merged.idle_s, merged.first_byte_s) == (2, 5, 300)


def test_api_keys_are_comma_separated_and_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MICROSCHEDULER_API_KEYS", "key-one, key-two,,")
    settings = load_settings(write(tmp_path, ISSUE_EXAMPLE))
    assert [k.get_secret_value() for k in settings.api_keys] == ["key-one", "key-two"]
    assert "key-one" not in repr(settings)


def test_cli_overrides_win_over_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MICROSCHEDULER_PORT", "9000")
    settings = load_settings(write(tmp_path, ISSUE_EXAMPLE), port=9100)
    assert settings.port == 9100


def test_optional_files_are_read_when_present(tmp_path: Path) -> None:
    write(tmp_path, ISSUE_EXAMPLE)
    assert load_settings(tmp_path).cloud_providers is None
    write(tmp_path, "providers: {}\nchains: {}\n", "cloud_providers.yaml")
    write(tmp_path, "profiles: {all: {}}\n", "gpu_profiles.yaml")
    settings = load_settings(tmp_path)
    assert settings.cloud_providers == CloudConfig()
    assert settings.gpu_profiles is not None
    assert list(settings.gpu_profiles.profiles) == ["all"]


def test_missing_directory_and_file_are_named(tmp_path: Path) -> None:
    assert problems(tmp_path / "nope") == [f"{tmp_path / 'nope'}: config directory does not exist"]
    assert problems(tmp_path)[0].startswith(f"{tmp_path / 'models.yaml'}: file not found")


def test_a_binary_or_deeply_nested_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_bytes(b"backends:\n  \xf8\x00\xff")
    (line,) = problems(tmp_path)
    assert line == (
        f"{tmp_path / 'models.yaml'}: not UTF-8 text (byte 0xf8 at offset 12): "
        "a YAML file is expected"
    )
    write(tmp_path, "backends: " + "[" * 3000 + "]" * 3000 + "\n")
    (line,) = problems(tmp_path)
    assert line == f"{tmp_path / 'models.yaml'}: invalid YAML: nested too deeply"
    write(tmp_path, "backends:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 1500)))
    (line,) = problems(tmp_path)
    assert line == f"{tmp_path / 'models.yaml'}: invalid YAML: nested too deeply"


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, "backends:\n  a: [unclosed\n")
    (line,) = problems(tmp_path)
    assert line.startswith(f"{tmp_path / 'models.yaml'}: line 3 column 1: invalid YAML")


def test_invalid_optional_file_is_named(tmp_path: Path) -> None:
    write(tmp_path, ISSUE_EXAMPLE)
    write(tmp_path, "- a list\n", "gpu_profiles.yaml")
    (line,) = problems(tmp_path)
    assert line.startswith(f"{tmp_path / 'gpu_profiles.yaml'}: the top level must be a mapping")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            ISSUE_EXAMPLE.replace("http://127.0.0.1:8199", "127.0.0.1:8199"),
            "models.yaml: backends.orchestrator.url: must be an http(s) base URL",
        ),
        (
            ISSUE_EXAMPLE.replace("http://127.0.0.1:8199", "http://127.0.0.1:8199/v1"),
            "models.yaml: backends.orchestrator.url: is the server's base URL without /v1",
        ),
        (
            ISSUE_EXAMPLE.replace("[nemotron-8b]", "[]"),
            "models.yaml: backends.orchestrator.models: List should have at least 1 item",
        ),
        (
            ISSUE_EXAMPLE.replace("role: orchestrator", "rol: orchestrator"),
            "models.yaml: backends.orchestrator.rol: unknown key",
        ),
        (
            ISSUE_EXAMPLE.replace("{kind: external}", "{kind: podman}"),
            "models.yaml: backends.orchestrator.runtime: Input tag 'podman' found",
        ),
        (
            ISSUE_EXAMPLE.replace("{kind: external}", "{kind: process}"),
            "models.yaml: backends.orchestrator.runtime.process.command: is required",
        ),
        (
            ISSUE_EXAMPLE.replace(
                "role: orchestrator", "role: orchestrator\n    min_resident_s: 30"
            ),
            "models.yaml: backends.orchestrator: min_resident_s: applies to lifecycle: lazy or "
            "standby only",
        ),
        ("backends: {}\n", "models.yaml: backends: Dictionary should have at least 1 item"),
        ("timeouts: {}\n", "models.yaml: backends: is required"),
        (
            ISSUE_EXAMPLE + "timeouts: {idle_s: -1}\n",
            "models.yaml: timeouts.idle_s: Input should be greater than 0",
        ),
        (
            ISSUE_EXAMPLE + "api_keys: [abc]\n",
            "models.yaml: api_keys: may only be set through the environment",
        ),
    ],
)
def test_invalid_config_names_file_key_and_problem(
    tmp_path: Path, text: str, expected: str
) -> None:
    found = problems(write(tmp_path, text))
    assert any(expected in line for line in found), found


def test_duplicate_names_across_backends_are_rejected(tmp_path: Path) -> None:
    text = ISSUE_EXAMPLE + (
        "  reasoning:\n    url: http://127.0.0.1:8198\n    models: [r1]\n    aliases: [default]\n"
    )
    (line,) = problems(write(tmp_path, text))
    assert "backends.reasoning.aliases: 'default' is already served by backend 'orchestrator'" in (
        line
    )


def test_bad_environment_value_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MICROSCHEDULER_TIMEOUTS__IDLE_S", "soon")
    (line,) = problems(write(tmp_path, ISSUE_EXAMPLE))
    assert line.startswith("environment MICROSCHEDULER_TIMEOUTS__IDLE_S: ")


def test_shipped_configs_are_valid() -> None:
    root = Path(__file__).resolve().parents[3] / "config"
    for directory in (root, root / "demo"):
        assert load_settings(directory).backends


def test_a_profile_naming_an_unknown_backend_is_refused_naming_the_file(tmp_path: Path) -> None:
    write(tmp_path, ISSUE_EXAMPLE)
    write(tmp_path, "profiles: {dev: {models: {ghost: {vram_pct: 10}}}}\n", "gpu_profiles.yaml")
    (line,) = problems(tmp_path)
    assert line.startswith(
        f"{tmp_path / 'gpu_profiles.yaml'}: profiles.dev.models.ghost: no backend of that name"
    )


def test_profile_shares_above_the_target_are_refused(tmp_path: Path) -> None:
    write(tmp_path, ISSUE_EXAMPLE)
    write(
        tmp_path,
        "profiles:\n  dev:\n    target_utilization_pct: 70\n    models:\n"
        "      orchestrator: {vram_pct: 40}\n      reasoning: {vram_pct: 35}\n",
        "gpu_profiles.yaml",
    )
    (line,) = problems(tmp_path)
    assert line == (
        f"{tmp_path / 'gpu_profiles.yaml'}: profiles.dev: models: the enabled vram_pct add up "
        "to 75% (orchestrator 40 + reasoning 35), more than target_utilization_pct 70%"
    )


def test_the_shipped_keys_example_is_valid_beside_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path(__file__).resolve().parents[3] / "config"
    for name in ("models.yaml", "cloud_providers.yaml", "gpu_profiles.yaml"):
        (tmp_path / name).write_text((root / "demo" / name).read_text())
    (tmp_path / "keys.yaml").write_text((root / "keys.example.yaml").read_text())
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path)  # the secrets' variables are not set yet
    assert "keys.agents.key_env: AGENTS_KEY is not set" in str(info.value)
    for var in ("AGENTS_KEY", "FAMILY_KEY", "BATCH_KEY"):
        monkeypatch.setenv(var, f"sk-{var.lower()}")
    keys = load_settings(tmp_path).client_keys
    assert keys is not None
    assert list(keys.keys) == ["agents", "family", "batch"]
    assert keys.keys["family"].fallback_on == ["queue_full"]  # as docs/keys.md shows it


def test_the_keys_page_shows_the_shipped_keys_example() -> None:
    """docs/keys.md shows config/keys.example.yaml's keys (its comments may differ)."""
    shown = section(page("keys"), "Sharing one GPU: keys and usage").split("```yaml\n", 1)[1]
    shipped = (Path(__file__).resolve().parents[3] / "config" / "keys.example.yaml").read_text()
    assert yaml.safe_load(shown.split("```", 1)[0]) == yaml.safe_load(shipped)


LAZY_BACKEND = {
    "url": "http://127.0.0.1:8000",
    "models": ["m"],
    "lifecycle": "lazy",
    "vram_mib": 8000,
    "runtime": {"kind": "process", "command": ["serve"]},
}


def test_idle_and_eviction_are_auto_by_default_and_yield_reads_as_before() -> None:
    backend = BackendConfig.model_validate(
        {**LAZY_BACKEND, "yield": {"method": "sleep", "level": 2}}
    )
    assert (backend.yield_.method, backend.yield_.sleep_level) == ("sleep", 2)
    assert (backend.idle.method, backend.idle.sleep_level) == ("auto", 2)
    assert (backend.eviction.method, backend.eviction.sleep_level) == ("auto", 2)
    assert backend.asleep_mib is None


def test_idle_and_eviction_take_the_same_methods_as_yield() -> None:
    backend = BackendConfig.model_validate(
        {
            **LAZY_BACKEND,
            "idle": {"method": "sleep", "level": 2},
            "eviction": {"method": "sleep"},
            "asleep_mib": 1000,
        }
    )
    assert (backend.idle.method, backend.idle.sleep_level) == ("sleep", 2)
    assert (backend.eviction.method, backend.eviction.sleep_level) == ("sleep", 1)
    assert backend.asleep_mib == 1000


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"idle": {"method": "hibernate"}}, "idle.method"),
        ({"idle": {"method": "sleep", "level": 3}}, "idle.level"),
        ({"eviction": {"method": "pause"}}, "eviction.method"),
        ({"eviction": {"level": 0}}, "eviction.level"),
        ({"yield": {"method": "sleep", "level": 0}}, "yield.level"),
        ({"idle": {"method": "sleep", "ttl_s": 60}}, "idle.ttl_s"),
        ({"asleep_mib": 9000}, "asleep_mib: 9000 is more than vram_mib: 8000"),
        ({"asleep_mib": -1}, "asleep_mib"),
    ],
)
def test_bad_release_methods_and_levels_are_refused(fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError) as info:
        BackendConfig.model_validate({**LAZY_BACKEND, **fields})
    assert expected in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9100/config/reload",
        "http://localhost:9100/vram/yield",
        "http://[::1]:9100/x",
        "http://0.0.0.0:9100/x",
    ],
)
def test_a_notify_target_that_is_the_gateway_itself_is_refused(tmp_path: Path, url: str) -> None:
    write(tmp_path, "backends:\n  b: {url: 'http://127.0.0.1:9', models: [m]}\n"
          f"notify:\n  - url: '{url}'\n")  # fmt: skip
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path, port=9100)
    (line,) = info.value.problems
    assert "notify: target 0 posts to this gateway itself" in line
    assert "loop" in line
    # Another port on the same machine is another server: accepted.
    assert load_settings(tmp_path, port=9101).notify[0].url == url


def test_ollama_is_no_api_a_backend_serves(tmp_path: Path) -> None:
    """`ollama` names the gateway's own translation of Ollama's /api/* (app.api.ollama):
    listed under a backend's `endpoints:` it would send Ollama's bodies to a vLLM."""
    write(tmp_path, ISSUE_EXAMPLE + "    endpoints: [chat, ollama]\n")
    (problem,) = problems(tmp_path)
    assert "ollama is not an API a backend or provider serves" in problem
