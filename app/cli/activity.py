"""`microscheduler activity [--limit N] [--model M] [--key K]`: the last requests a running
gateway answered, newest first, as a table (`GET /activity`; `--json` prints its answer).

Columns: when it arrived (local time), the client key, the model, the route (the backend
or provider that answered), the API, the status, the prompt and completion tokens (`-`
when the answer had no usage), completion tokens per second, the wait and why (`none`,
`queue`, `wake`, `limit`, `yield`), the fallbacks taken and the duration. A response that
broke after its status line went out (a stream ended by an error event) shows the error
after its status: `200 (upstream_500)`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any
from urllib.parse import urlencode

from app.cli.common import Subparsers, positive_int, table
from app.cli.gateway import JsonDict, add_url_option, show

DEFAULT_LIMIT = 20


def add_activity_command(subparsers: Subparsers) -> None:
    activity = subparsers.add_parser(
        "activity", help="the last requests the gateway answered, newest first"
    )
    add_url_option(activity)
    activity.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_LIMIT,
        help=f"how many (default {DEFAULT_LIMIT})",
    )
    activity.add_argument("--model", default=None, help="only requests for this model")
    activity.add_argument("--key", default=None, help="only requests with this client key")
    activity.add_argument("--json", action="store_true", help="print the gateway's answer")
    activity.set_defaults(func=run_activity)


def run_activity(args: argparse.Namespace) -> int:
    query: dict[str, Any] = {"limit": args.limit}
    if args.model is not None:
        query["model"] = args.model
    if args.key is not None:
        query["key"] = args.key
    return show(args, "activity", "GET", f"/activity?{urlencode(query)}", render)


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _seconds(value: float) -> str:
    return f"{value:.3f}s" if value < 1 else f"{value:.2f}s"


def _status(entry: JsonDict) -> str:
    """The status that went out; a response that broke after it says with what."""
    broke = entry.get("stream_error")
    return str(entry["status"]) if broke is None else f"{entry['status']} ({broke})"


def render(answer: JsonDict) -> str:
    entries = answer.get("entries") or []
    if not entries:
        return "no requests yet"
    rows = [["time", "key", "model", "route", "api", "status", "tokens in/out", "tok/s",
             "wait", "fallbacks", "duration"]]  # fmt: skip
    for e in entries:
        prompt, completion = e.get("prompt_tokens"), e.get("completion_tokens")
        tokens = "-" if prompt is None and completion is None else (
            f"{_or_dash(prompt)}/{_or_dash(completion)}"
        )  # fmt: skip
        rate = e.get("tokens_per_s")
        wait = "-" if e["wait_reason"] == "none" else f"{_seconds(e['wait_s'])} {e['wait_reason']}"
        rows.append([
            time.strftime("%H:%M:%S", time.localtime(e["at"])),
            _or_dash(e.get("key")), _or_dash(e.get("model")), _or_dash(e.get("route")),
            e["api"], _status(e), tokens, "-" if rate is None else f"{rate:.1f}",
            wait, str(e["fallbacks"]), _seconds(e["duration_s"]),
        ])  # fmt: skip
    return "\n".join(table(rows))
