"""Every check across fields of the root settings holds whichever source the value comes
from: the YAML files, the environment, or the command line (`serve --host`). The three are
validated together, so a flag cannot slip past a check the YAML or the environment would
meet (the refusal to listen beyond loopback with paid chains and no client key was
skipped for `--host`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.settings import ConfigError, load_settings

TWO = """\
backends:
  a: {url: "http://127.0.0.1:8001", models: [m1], role: reasoning}
  b: {url: "http://127.0.0.1:8002", models: [m2]}
"""
REPLICAS = """\
backends:
  a: {url: "http://127.0.0.1:8001", models: [m1], replica_of: g}
  b: {url: "http://127.0.0.1:8002", models: [m2]}
"""
PAID = """\
providers:
  deepseek: {kind: openai, base_url: https://api.deepseek.com/v1, api_key_env: DEEPSEEK_API_KEY,
             model: deepseek-reasoner}
chains:
  reasoning: [a, deepseek]
"""
KEYS = """\
keys:
  alice: {key_env: ALICE_KEY, models: [m1]}
"""


@dataclass(frozen=True)
class Case:
    """One source breaking one check: the files, the environment, the flags."""

    files: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)


# check -> {source: a configuration that breaks it through that source}, and what the
# refusal says. The command line sets only `host` and `port`, so only the checks that
# read them have a flag case.
CHECKS: dict[str, tuple[dict[str, Case], str]] = {
    "unique model names": (
        {
            "yaml": Case({"models.yaml": TWO.replace("models: [m2]", "models: [m1]")}),
            "env": Case({"models.yaml": TWO}, {"MICROSCHEDULER_BACKENDS__B__MODELS": '["m1"]'}),
        },
        "'m1' is already served by backend 'a'",
    ),
    "a replica group is not named after a backend": (
        {
            "yaml": Case(
                {"models.yaml": TWO.replace("models: [m2]}", "models: [m2], replica_of: a}")}
            ),
            "env": Case({"models.yaml": TWO}, {"MICROSCHEDULER_BACKENDS__B__REPLICA_OF": "a"}),
        },
        "'a' is the name of a backend",
    ),
    "replicas serve the same model": (
        {
            "yaml": Case(
                {"models.yaml": REPLICAS.replace("models: [m2]}", "models: [m2], replica_of: g}")}
            ),
            "env": Case({"models.yaml": REPLICAS}, {"MICROSCHEDULER_BACKENDS__B__REPLICA_OF": "g"}),
        },
        "must serve the same upstream model id",
    ),
    "a backend's host is one of hosts:": (
        {
            "yaml": Case(
                {"models.yaml": TWO.replace("models: [m2]}", "models: [m2], host: nowhere}")}
            ),
            "env": Case({"models.yaml": TWO}, {"MICROSCHEDULER_BACKENDS__B__HOST": "nowhere"}),
        },
        "no host 'nowhere' in hosts:",
    ),
    "chains name what models.yaml defines": (
        {
            "yaml": Case(
                {"models.yaml": TWO, "cloud_providers.yaml": PAID.replace("[a, deepseek]", "[zz]")}
            ),
            "env": Case(
                {"models.yaml": TWO, "cloud_providers.yaml": PAID},
                {"MICROSCHEDULER_CLOUD_PROVIDERS__CHAINS__REASONING": '["zz"]'},
            ),
        },
        "'zz' is neither a backend",
    ),
    "a key's models exist": (
        {
            "yaml": Case(
                {"models.yaml": TWO, "keys.yaml": KEYS.replace("[m1]", "[nope]")},
                {"ALICE_KEY": "s1"},
            ),
            "env": Case(
                {"models.yaml": TWO, "keys.yaml": KEYS},
                {"ALICE_KEY": "s1", "MICROSCHEDULER_CLIENT_KEYS__KEYS__ALICE__MODELS": '["nope"]'},
            ),
        },
        "no model or alias 'nope'",
    ),
    "no two keys share a secret": (
        {
            "yaml": Case(
                {
                    "models.yaml": TWO,
                    "keys.yaml": KEYS + "  bob: {key_env: ALICE_KEY}\n",
                },
                {"ALICE_KEY": "s1"},
            ),
            "env": Case(
                {"models.yaml": TWO, "keys.yaml": KEYS},
                {"ALICE_KEY": "s1", "MICROSCHEDULER_API_KEYS": "s1"},
            ),
        },
        "have the same secret",
    ),
    "no open address with paid chains and no client key": (
        {
            "yaml": Case(
                {"models.yaml": TWO + "host: 0.0.0.0\n", "cloud_providers.yaml": PAID},
            ),
            "env": Case(
                {"models.yaml": TWO, "cloud_providers.yaml": PAID},
                {"MICROSCHEDULER_HOST": "0.0.0.0"},
            ),
            "flag": Case(
                {"models.yaml": TWO, "cloud_providers.yaml": PAID},
                flags={"host": "0.0.0.0"},
            ),
        },
        "host: listening on 0.0.0.0 without MICROSCHEDULER_API_KEYS",
    ),
}

CASES = [
    pytest.param(case, expected, id=f"{check}-{source}")
    for check, (sources, expected) in CHECKS.items()
    for source, case in sources.items()
]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MICROSCHEDULER_"):
            monkeypatch.delenv(name)


def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: Case) -> Any:
    for name, text in case.files.items():
        (tmp_path / name).write_text(text)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    return load_settings(tmp_path, **case.flags)


@pytest.mark.parametrize(("case", "expected"), CASES)
def test_every_cross_field_check_holds_from_every_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: Case, expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, monkeypatch, case)
    assert any(expected in line for line in info.value.problems), info.value.problems


def test_each_check_case_is_valid_without_its_break(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base configurations start: each refusal above comes from its one break."""
    monkeypatch.setenv("ALICE_KEY", "s1")
    for files in ({"models.yaml": TWO}, {"models.yaml": REPLICAS}):
        for name, text in files.items():
            (tmp_path / name).write_text(text)
        load_settings(tmp_path)
    (tmp_path / "cloud_providers.yaml").write_text(PAID)
    (tmp_path / "keys.yaml").write_text(KEYS)
    (tmp_path / "models.yaml").write_text(TWO)
    assert load_settings(tmp_path, host="0.0.0.0").host == "0.0.0.0"  # a client key: allowed


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("yaml", "models.yaml: host: listening on 0.0.0.0"),
        ("env", "environment MICROSCHEDULER_HOST: host: listening on 0.0.0.0"),
        ("flag", "command line --host: host: listening on 0.0.0.0"),
    ],
)
def test_the_open_address_refusal_names_where_the_address_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, expected: str
) -> None:
    sources, _ = CHECKS["no open address with paid chains and no client key"]
    with pytest.raises(ConfigError) as info:
        load(tmp_path, monkeypatch, sources[source])
    (line,) = info.value.problems
    assert line.startswith(f"{tmp_path}/{expected}" if source == "yaml" else expected), line
    assert "MICROSCHEDULER_ALLOW_UNAUTHENTICATED=1" in line


@pytest.mark.parametrize(
    "opt_in",
    [
        Case({"models.yaml": TWO + "allow_unauthenticated: true\n"}),
        Case({"models.yaml": TWO}, {"MICROSCHEDULER_ALLOW_UNAUTHENTICATED": "1"}),
        Case({"models.yaml": TWO}, {"MICROSCHEDULER_API_KEYS": "k1"}),
    ],
    ids=["yaml-allow", "env-allow", "env-api-keys"],
)
def test_a_flag_host_starts_with_a_key_or_an_explicit_opt_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opt_in: Case
) -> None:
    (tmp_path / "cloud_providers.yaml").write_text(PAID)
    case = Case(opt_in.files, opt_in.env, {"host": "0.0.0.0", "port": 8080})
    settings = load(tmp_path, monkeypatch, case)
    assert (settings.host, settings.port) == ("0.0.0.0", 8080)


def test_a_loopback_flag_wins_over_an_open_address_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = Case(
        {"models.yaml": TWO, "cloud_providers.yaml": PAID},
        {"MICROSCHEDULER_HOST": "0.0.0.0"},
        {"host": "127.0.0.1"},
    )
    assert load(tmp_path, monkeypatch, case).host == "127.0.0.1"


def test_a_flag_value_is_validated_like_the_same_key_in_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, monkeypatch, Case({"models.yaml": TWO}, flags={"port": 70000}))
    (line,) = info.value.problems
    assert line.startswith("command line --port: ")
    assert "65535" in line


def test_the_command_line_key_cannot_be_smuggled_in_through_yaml(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text(TWO + '"<command line>": {host: 0.0.0.0}\n')
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path)
    assert "unknown key" in info.value.problems[0]


def test_serve_with_an_open_host_flag_is_refused_before_listening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`microscheduler serve --host 0.0.0.0` (docs/operations.md's example without its key) exits 1
    with the refusal; it never reaches uvicorn."""
    from app.cli import build_parser
    from app.cli.common import FAILED

    (tmp_path / "models.yaml").write_text(TWO)
    (tmp_path / "cloud_providers.yaml").write_text(PAID)
    args = build_parser().parse_args(["serve", "--config", str(tmp_path), "--host", "0.0.0.0"])
    assert args.func(args) == FAILED
    err = capsys.readouterr().err
    assert "command line --host: host: listening on 0.0.0.0" in err
