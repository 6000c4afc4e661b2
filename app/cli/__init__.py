"""`microscheduler serve | check-config | add | plan ... | profile ... | yield | restore | status |
ps | start | stop | activity | usage | logs | reload | config schema`.

Every subcommand takes its configuration from `--config` (default:
$MICROSCHEDULER_CONFIG_DIR or config/), prints errors as `error: <command>: <message>` on
stderr (an invalid configuration as every problem, indented) and exits with the same codes:
0 success, 1 failed (invalid configuration, the gateway answered an error, a plan does not
fit), 2 usage (arguments or input values the command cannot use), 3 the gateway cannot be
reached, 141 the reader of the output went away (`| head`). See `app.cli.common`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from app.cli.activity import add_activity_command
from app.cli.add import add_add_command
from app.cli.admin_key import KeyFileError
from app.cli.backends import add_backend_commands
from app.cli.common import BROKEN_PIPE, EXIT_CODES_HELP, USAGE, error
from app.cli.config_schema import add_config_command
from app.cli.gaming import add_gaming_commands
from app.cli.logs import add_logs_command
from app.cli.plan import add_plan_command
from app.cli.profile import add_profile_command
from app.cli.reload import add_reload_command
from app.cli.serve import add_serve_commands
from app.cli.status import add_status_command
from app.cli.usage import add_usage_command


def _version() -> str:
    try:
        return metadata.version("microscheduler")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="microscheduler",
        description="An OpenAI-compatible gateway for local LLMs sharing a GPU.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_commands(commands)
    add_add_command(commands)
    add_plan_command(commands)
    add_profile_command(commands)
    add_gaming_commands(commands)
    add_status_command(commands)
    add_backend_commands(commands)
    add_activity_command(commands)
    add_usage_command(commands)
    add_logs_command(commands)
    add_reload_command(commands)
    add_config_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a reader that left is found here, not at the interpreter's exit
    except KeyFileError as exc:  # --admin-key-file (or its variable) names no usable file
        error(args.command, str(exc))
        sys.exit(USAGE)
    except BrokenPipeError:
        # `microscheduler status | head -1`: the reader has what it wanted. Python's own
        # recipe (the `signal` module's notes on SIGPIPE): stdout to /dev/null, so the
        # flush at exit writes nowhere instead of printing a second error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(BROKEN_PIPE)
    sys.exit(code)


if __name__ == "__main__":
    main()
