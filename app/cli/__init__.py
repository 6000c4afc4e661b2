"""`microscheduler serve | check-config | plan ... | profile ...`.

Every subcommand takes its configuration from `--config` (default:
$MICROSCHEDULER_CONFIG_DIR or config/), prints errors as `error: <command>: <message>` on
stderr (an invalid configuration as every problem, indented) and exits with the same codes:
0 success, 1 failed (invalid configuration, the gateway answered an error), 2 usage
(arguments or input values the command cannot use), 3 the gateway cannot be reached.
See `app.cli.common`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from app.cli.common import EXIT_CODES_HELP
from app.cli.plan import add_plan_command
from app.cli.profile import add_profile_command
from app.cli.serve import add_serve_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="microscheduler",
        description="An OpenAI-compatible gateway for local LLMs sharing a GPU.",
        epilog=EXIT_CODES_HELP,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_commands(commands)
    add_plan_command(commands)
    add_profile_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
