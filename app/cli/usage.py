"""`microscheduler usage [--since DAY] [--until DAY] [--key K] [--group-by G]`: the usage
ledger of a running gateway (`GET /usage`; `--json` prints its answer) as a table: per
model, key, route or UTC day, the requests, prompt, completion and cloud tokens (and per
route the estimated cost, from the provider's `cost_per_mtok`).
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any
from urllib.parse import urlencode

from app.cli.common import Subparsers, table
from app.cli.gateway import JsonDict, add_url_option, show

GROUPS = ("model", "key", "route", "day")


def _day(text: str) -> str:
    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a day like 2025-01-31: {text!r}") from None


def add_usage_command(subparsers: Subparsers) -> None:
    usage = subparsers.add_parser("usage", help="tokens used, per model, key, route or day")
    add_url_option(usage)
    usage.add_argument("--since", type=_day, default=None, help="first UTC day (YYYY-MM-DD)")
    usage.add_argument("--until", type=_day, default=None, help="last UTC day (YYYY-MM-DD)")
    usage.add_argument("--key", default=None, help="only this client key")
    usage.add_argument(
        "--group-by", choices=GROUPS, default="model", help="rows per (default model)"
    )
    usage.add_argument("--json", action="store_true", help="print the gateway's answer")
    usage.set_defaults(func=run_usage)


def run_usage(args: argparse.Namespace) -> int:
    query: dict[str, Any] = {"group_by": args.group_by}
    for name in ("since", "until", "key"):
        if getattr(args, name) is not None:
            query[name] = getattr(args, name)
    return show(args, "usage", "GET", f"/usage?{urlencode(query)}", render)


def render(answer: JsonDict) -> str:
    rows = answer.get("rows") or []
    if not rows:
        return "no usage recorded"
    group = str(answer.get("group_by", "model"))
    costs = group == "route"
    header = [group, "requests", "prompt", "completion", "cloud tokens"]
    lines = [header + (["cost"] if costs else [])]
    for row in [*rows, {group: "total", **answer.get("totals", {})}]:
        line = [str(row.get(group)), str(row.get("requests", "")),
                str(row.get("prompt_tokens", "")), str(row.get("completion_tokens", "")),
                str(row.get("cloud_tokens", ""))]  # fmt: skip
        if costs:
            cost = row.get("cost")
            line.append("-" if cost is None else f"{cost:.4f}")
        lines.append(line)
    return "\n".join(table(lines))
