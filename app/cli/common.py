"""What every subcommand shares: the `--config` option, how configuration errors are
printed, one error line format and the exit codes.

Exit codes (the same for every subcommand):

    0  success
    1  the command ran and failed: the configuration is invalid (every problem listed),
       the gateway answered with an error, or a plan does not fit (`plan share`,
       `plan profile`, `plan gpus`: the plan is printed, `"fits": false`, as
       `check-config` prints the problems of a configuration it refuses)
    2  usage: arguments or input values the command cannot use (argparse's own code)
    3  the gateway cannot be reached
  141  the reader of the output went away (`microscheduler status | head -1`): the rest of
       the output is dropped without a traceback, and the code is the one a shell reports
       for a command that SIGPIPE ended (128 + 13), so `set -o pipefail` sees what it sees
       for `cat`; 0 would say that everything was delivered
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeAlias

from app.settings import ConfigError, Settings, load_settings

OK: Final = 0
FAILED: Final = 1
USAGE: Final = 2
UNREACHABLE: Final = 3
BROKEN_PIPE: Final = 141  # 128 + SIGPIPE

EXIT_CODES_HELP: Final = (
    "exit codes: 0 success; 1 failed (invalid configuration, the gateway answered an "
    "error, a plan does not fit); 2 usage (arguments or input the command cannot use); "
    "3 gateway unreachable; 141 the reader of the output went away (| head)"
)

Handler = Callable[[argparse.Namespace], int]
JsonDict = dict[str, Any]
#: What `add_subparsers` returns: each module's `add_*_command(s)` adds its parsers to it.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class UsageError(ValueError):
    """Input the command cannot use that argparse does not catch itself (exit 2)."""


class CommandFailed(Exception):
    """Ends a command with `code`; its message has been printed already."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config directory (default: $MICROSCHEDULER_CONFIG_DIR or config/)",
    )


def load_config(directory: Path | None, **overrides: Any) -> Settings:
    """The settings, or every configuration problem on stderr and `CommandFailed(1)`."""
    try:
        return load_settings(directory, **overrides)
    except ConfigError as exc:
        print("microscheduler: invalid configuration:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        raise CommandFailed(FAILED) from None


def error(command: str, message: str) -> None:
    """The one error line: `error: <command>: <message>` on stderr, on one line."""
    print(f"error: {command}: {' '.join(message.split())}", file=sys.stderr)


def guarded(handler: Handler, command: Callable[[argparse.Namespace], str]) -> Handler:
    """`handler` with its failures turned into exit codes: bad input values (`ValueError`,
    an unreadable file) are usage errors, printed as one error line."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except CommandFailed as exc:
            return exc.code
        except BrokenPipeError:
            raise  # the reader left: `app.cli.main` ends the command
        except (ValueError, OSError) as exc:
            error(command(args), str(exc))
            return USAGE

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


def emit(args: argparse.Namespace, data: JsonDict, text: str) -> int:
    """Print `data` as one JSON object with `--json`, else `text`."""
    print(json.dumps(data, sort_keys=False) if args.json else text)
    return OK


def emit_plan(args: argparse.Namespace, data: JsonDict, text: str, *, fits: bool) -> int:
    """`emit` for a plan that says whether it fits: exit 1 when it does not, so a script
    (or `&&`) can tell, as `check-config` exits 1 for a configuration it refuses."""
    emit(args, data, text)
    return OK if fits else FAILED


def seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return value


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def table(rows: list[list[str]]) -> list[str]:
    """`rows` (the first one the header) as lines of left-aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
