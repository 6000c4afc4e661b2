"""The one CLI convention: configuration errors, the error line and the exit codes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from app.cli import build_parser
from app.cli.common import FAILED, OK, UNREACHABLE, USAGE, guarded, load_config


def test_the_exit_codes_are_distinct() -> None:
    assert len({OK, FAILED, USAGE, UNREACHABLE}) == 4
    assert USAGE == 2  # argparse's own code for usage errors


def test_an_invalid_configuration_prints_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "models.yaml").write_text("backends:\n  a: {url: 'not a url', models: []}\n")

    def check(args: argparse.Namespace) -> int:
        load_config(args.config)
        return OK

    assert guarded(check, lambda _: "test")(argparse.Namespace(config=tmp_path)) == FAILED
    first, *problems = capsys.readouterr().err.splitlines()
    assert first == "microscheduler: invalid configuration:"
    assert len(problems) >= 2, problems  # every problem, not the first one only
    assert all(line.startswith(f"  {tmp_path / 'models.yaml'}: ") for line in problems)


def test_bad_input_values_are_one_error_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def bad(args: argparse.Namespace) -> int:
        raise ValueError("--gpu-gib must be\n   a positive number")

    assert guarded(bad, lambda _: "plan kv")(argparse.Namespace()) == USAGE
    assert capsys.readouterr().err == "error: plan kv: --gpu-gib must be a positive number\n"


@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_every_config_reading_command_has_the_same_config_option(command: str) -> None:
    parser = build_parser()
    args = parser.parse_args([command, "--config", "somewhere"])
    assert args.config == Path("somewhere")
    args = parser.parse_args(["plan", "profile", "--config", "somewhere"])
    assert args.config == Path("somewhere")


def test_check_config_with_a_missing_directory_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args(["check-config", "--config", str(tmp_path / "nope")])
    assert args.func(args) == FAILED
    assert "microscheduler: invalid configuration:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["yield", "--ttl", "0"], "argument --ttl: must be a positive number of seconds"),
        (["yield", "--min-free-mib", "0"], "argument --min-free-mib: must be a positive whole"),
        (["profile", "list", "--timeout", "-1"], "argument --timeout: must be a positive"),
    ],
)
def test_values_a_command_cannot_use_are_usage_errors(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == USAGE
    assert said in capsys.readouterr().err


def test_check_config_says_the_host_of_a_backend_on_another_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "models.yaml").write_text(
        "hosts:\n"
        "  node-c: {gpu: {probe: sim}}\n"
        "backends:\n"
        "  here: {url: 'http://127.0.0.1:9001', models: [a]}\n"
        "  there: {url: 'http://127.0.0.1:9002', models: [b], host: node-c}\n"
    )
    args = build_parser().parse_args(["check-config", "--config", str(tmp_path)])
    assert args.func(args) == OK
    out = capsys.readouterr().out
    assert "  here: http://127.0.0.1:9001 [external] serves a\n" in out
    assert "  there: http://127.0.0.1:9002 [external on node-c] serves b\n" in out


def test_check_config_warns_of_a_connection_cap_the_file_limit_cannot_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = "backends:\n  here: {url: 'http://127.0.0.1:9001', models: [a]}\n"
    (tmp_path / "models.yaml").write_text(models + "server: {max_connections: 100}\n")
    args = build_parser().parse_args(["check-config", "--config", str(tmp_path)])
    assert args.func(args) == OK
    assert "connections" not in capsys.readouterr().out  # 100 fit in any file limit
    # Two million files: more than any kernel lets a process open (fs.nr_open).
    (tmp_path / "models.yaml").write_text(models + "server: {max_connections: 1000000}\n")
    assert args.func(args) == OK  # a warning, not a refusal
    out = capsys.readouterr().out
    assert "warning: connections: server.max_connections 1,000,000 needs about 2,001,024" in out
    assert "Lower max_connections to" in out
