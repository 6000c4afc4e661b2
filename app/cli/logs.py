"""`microscheduler logs NAME [-f] [--tail N] [--url URL]`: a backend server's own output,
from `GET /backends/NAME/logs` (admin), written to stdout as it comes (a tqdm bar's
updates end in `\\r`, so a terminal shows it in place). `-f` follows until Ctrl-C or the
server exits.
"""

from __future__ import annotations

import argparse
import sys

from app.cli.common import OK, USAGE, Subparsers, error
from app.cli.gateway import (
    GatewayRefused,
    Unreachable,
    add_url_option,
    reported,
    stream_text,
    url_of,
)


def add_logs_command(subparsers: Subparsers) -> None:
    logs = subparsers.add_parser("logs", help="a backend server's own output (admin)")
    logs.add_argument("name", help="the backend")
    logs.add_argument("-f", "--follow", action="store_true", help="follow new lines")
    logs.add_argument("--tail", type=int, default=100, help="last N lines (default 100)")
    add_url_option(logs)
    logs.set_defaults(func=run_logs)


def run_logs(args: argparse.Namespace) -> int:
    url = url_of(args)
    if args.tail < 0:
        error("logs", f"--tail must be >= 0, got {args.tail}")
        return USAGE
    path = f"/backends/{args.name}/logs"
    params = {"tail": str(args.tail), "follow": "1" if args.follow else "0"}
    try:
        for chunk in stream_text(url, path, params, args.admin_key_file):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    except (Unreachable, GatewayRefused) as exc:
        return reported("logs", exc)
    except KeyboardInterrupt:
        return OK
    return OK  # `| head`: BrokenPipeError goes to main's handler (141, as every command)
