"""A plan that does not fit exits 1 (its answer printed), as `check-config` exits 1 for a
configuration it refuses; the help lists it with the other exit codes."""

from __future__ import annotations

import argparse
import json

import pytest

from app.cli import build_parser, main
from app.cli.common import guarded

FITS = "name=A,weights-gib=6,kv-gib=2"
TOO_BIG = "name=B,weights-gib=30,kv-gib=8"


def exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    code = exited.value.code
    assert isinstance(code, int)
    return code


def test_plan_share_exits_0_when_it_fits(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["plan", "share", "--gpu-gib", "32", "--instance", FITS]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("fits: yes")
    assert err == ""


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_plan_share_exits_1_when_it_does_not_fit(
    json_flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "share", "--gpu-gib", "32", "--instance", FITS, "--instance", TOO_BIG]
    assert exit_code([*argv, *json_flag]) == 1
    out, err = capsys.readouterr()
    assert err == ""  # the answer is the plan, printed in full
    if json_flag:
        assert json.loads(out)["fits"] is False
    else:
        assert out.rstrip().endswith("fits: NO")


def test_plan_gpus_exits_1_when_no_count_fits(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "gpus", "--gpu-gib", "24", "--weights-gib", "640",
            "--bytes-per-token", "1024", "--context", "1000", "--max-gpus", "2"]  # fmt: skip
    assert exit_code(argv) == 1
    assert "none fits" in capsys.readouterr().out


def test_the_help_lists_a_plan_that_does_not_fit_under_exit_1() -> None:
    text = " ".join(build_parser().format_help().split())
    assert (
        "1 failed (invalid configuration, the gateway answered an error, a plan does not fit)"
        in text
    )


def test_a_guarded_command_leaves_a_reader_that_left_to_main() -> None:
    """`guarded` turns an `OSError` into a usage error (exit 2), but not a broken pipe:
    `app.cli.main` ends the command with 141, quietly."""

    def handler(args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        guarded(handler, lambda _: "plan share")(argparse.Namespace())
