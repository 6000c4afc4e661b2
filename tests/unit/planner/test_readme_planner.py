"""The VRAM planner page (docs/planner.md): every `console` block is the real output of its
command.

A block is `$ microscheduler ...` (continued by trailing backslashes) followed by the output
as the command prints it; a line `...` in the pasted output stands for any number of lines.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.docs import page
from tests.unit.cli.test_plan_cli import run
from tests.unit.planner.test_model_description import clean_env  # noqa: F401 (autouse)

ROOT = Path(__file__).resolve().parents[3]


def console_blocks() -> list[tuple[list[str], list[str]]]:
    section = page("planner")
    blocks: list[tuple[list[str], list[str]]] = []
    for chunk in section.split("```console\n")[1:]:
        lines = chunk.split("\n```", 1)[0].splitlines()
        command = lines.pop(0)
        while command.endswith("\\"):
            command = command[:-1] + lines.pop(0)
        assert command.startswith("$ microscheduler ")
        blocks.append((shlex.split(command)[2:], lines))
    return blocks


def matches(expected: list[str], actual: list[str]) -> bool:
    """`expected` equals `actual`, a `...` line matching any run of lines."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[cut:]) for cut in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


def test_the_section_has_the_worked_examples() -> None:
    commands = [argv[:2] for argv, _ in console_blocks()]
    assert commands == [["plan", "share"], ["plan", "profile"], ["plan", "backend"]]


@pytest.mark.parametrize(("argv", "expected"), console_blocks())
def test_each_pasted_output_is_what_the_command_prints(
    argv: list[str],
    expected: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)  # `--config config` is relative to the repository
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert matches(expected, out.rstrip("\n").splitlines()), out
