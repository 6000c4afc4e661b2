"""`microscheduler reload`: a running gateway reads its configuration again
(`POST /config/reload`, admin).

Prints what changed: backends updated in place, restarted, added and removed, and the
changes that need a restart of the gateway. A configuration the gateway refuses is
printed as its every problem; the gateway keeps the one it runs (exit 1). `--json`
prints the gateway's answer. Exit codes as `app.cli.common` says (3: unreachable).
"""

from __future__ import annotations

import argparse

from app.cli.common import Subparsers
from app.cli.gateway import JsonDict, add_call_options, show

# A reload drains what it restarts or removes before it answers.
DEFAULT_TIMEOUT_S = 300.0


def add_reload_command(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "reload", help="make a running gateway read its configuration again"
    )
    add_call_options(
        parser, timeout_s=DEFAULT_TIMEOUT_S, json_help="print the gateway's JSON answer"
    )
    parser.set_defaults(func=run_reload)


def run_reload(args: argparse.Namespace) -> int:
    return show(args, "reload", "POST", "/config/reload", render, timeout=args.timeout)


def render(body: JsonDict) -> str:
    config = body.get("config") or {}
    lines = [f"configuration reloaded (hash {config.get('hash', '?')})"]
    for key, label in (
        ("updated", "updated in place"),
        ("restarted", "restarted"),
        ("added", "added"),
        ("removed", "removed"),
    ):
        names = body.get(key) or []
        if names:
            lines.append(f"  {label}: {', '.join(names)}")
    if not any(body.get(k) for k in ("updated", "restarted", "added", "removed")):
        lines.append("  no backend changed")
    needs = body.get("restart_required") or []
    if needs:
        lines.append(f"  not applied, they need a restart of the gateway: {', '.join(needs)}")
    return "\n".join(lines)
