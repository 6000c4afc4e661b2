"""`microscheduler ps | start NAME | stop NAME`: a running gateway's backends, like
`ollama ps`, and starting or stopping one (its admin API: `GET /status`,
`POST /backends/{name}/start`, `POST /backends/{name}/stop`).

`ps` columns: the backend, its state, its lifecycle, the VRAM it holds now (`held_mib`,
MiB per GPU: measured at its last start, else what admission counts; asleep, what it
keeps; `-` when it holds none; `status` shows the same), the requests in flight, those
queued (held for its start or for a slot), and when idle: what its idle stop will do
(`idle.action`: sleep, stop) and the time until it (`idle_ttl_s`), `-` when none counts
down (pinned, no idle_ttl_s, not ready, or busy).

`start` waits until the backend is ready (a start takes what a wake takes: admission may
evict idle models to make room), `stop` until it is stopped (requests in flight drain
first); both print its state.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any
from urllib.parse import quote

from app.cli.common import Subparsers, table
from app.cli.gateway import JsonDict, add_call_options, add_url_option, show

# A start waits for the model to load (start_timeout_s, 300 s by default), a stop for the
# requests in flight to drain.
DEFAULT_TIMEOUT_S = 900.0


def add_backend_commands(subparsers: Subparsers) -> None:
    ps = subparsers.add_parser(
        "ps", help="the backends: state, VRAM held, requests, idle countdown"
    )
    add_url_option(ps)
    ps.add_argument("--json", action="store_true", help="print the /status backends")
    ps.set_defaults(func=run_ps)
    for verb, what in (("start", "start a backend and wait until it is ready"),
                       ("stop", "drain a backend's requests, then stop it")):  # fmt: skip
        command = subparsers.add_parser(verb, help=what)
        command.add_argument("name", help="the backend (as in models.yaml)")
        add_call_options(
            command, timeout_s=DEFAULT_TIMEOUT_S, json_help="print the gateway's answer"
        )
        command.set_defaults(func=run_start if verb == "start" else run_stop)


def run_ps(args: argparse.Namespace) -> int:
    return show(args, "ps", "GET", "/status", render_ps, view=_backends)


def _backends(status: JsonDict) -> list[JsonDict]:
    return status.get("backends") or []


def run_start(args: argparse.Namespace) -> int:
    return _act(args, "start")


def run_stop(args: argparse.Namespace) -> int:
    return _act(args, "stop")


def _act(args: argparse.Namespace, verb: str) -> int:
    path = f"/backends/{quote(args.name, safe='')}/{verb}"
    return show(args, verb, "POST", path, partial(render_state, verb), timeout=args.timeout)


def render_state(verb: str, view: JsonDict) -> str:
    """`NAME: STATE`, after a start with how long it took."""
    line = f"{view['name']}: {view['state']}"
    if verb == "start" and view.get("last_start_s") is not None:
        line += f" (its last start took {view['last_start_s']:.1f} s)"
    return line


def held_mib(backend: JsonDict) -> int | None:
    """MiB per GPU it holds now (None: none): the gateway's `held_mib`, which `status`
    shows too."""
    mib = backend.get("held_mib")
    return None if mib is None else int(mib)


def countdown(value: Any) -> str:
    """`4m 12s`, `38s`, `1h 2m`; `-` for None."""
    if value is None:
        return "-"
    left = max(0, round(float(value)))
    hours, rest = divmod(left, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def render_ps(backends: list[JsonDict]) -> str:
    if not backends:
        return "no backends"
    rows = [["backend", "state", "lifecycle", "VRAM MiB", "in flight", "queued", "when idle"]]
    for b in backends:
        mib = held_mib(b)
        rows.append([b["name"], b["state"], b["lifecycle"], "-" if mib is None else f"{mib:,}",
                     str(b["in_flight"]), str(b["waiting"]), when_idle(b)])  # fmt: skip
    return "\n".join(table(rows))


def when_idle(backend: JsonDict) -> str:
    """`sleep in 4m 12s` (or `stop in`, `sleep or stop in`: its `idle.action`, as the
    control page says it); `-` when no idle countdown runs."""
    left = backend.get("idle_stop_in_s")
    if left is None:
        return "-"
    action = (backend.get("idle") or {}).get("action") or "stop"
    return f"{action} in {countdown(left)}"
