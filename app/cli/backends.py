"""`microscheduler ps | load NAME | unload NAME | start NAME | stop NAME`: a running
gateway's backends, like `ollama ps`, and loading or unloading a model.

`load` and `unload` are the verbs (`POST /models/load`, `POST /models/unload`, as a
client with `lifecycle: true` has them): NAME is a model id, alias or backend name; `load`
starts or wakes it as a request would and waits until it is ready (`--no-wait`: once it
has begun), `unload` drains it, then sleeps or stops it as its `idle:` method says. `start`
and `stop` are the low-level verbs of the admin API (`POST /backends/{name}/start`,
`.../stop`): NAME is a backend, and `stop` always stops (whatever `idle:` says).

`ps` columns: the backend, its state, its lifecycle, the GPUs it holds memory on now
(`gpus`, e.g. `0,1`; `-` when none: `status` says why it went there), the VRAM it holds
now on each of them (`held_mib`,
MiB per GPU: measured at its last start, else what admission counts; asleep, what it
keeps; `-` when it holds none; `status` shows the same), the requests in flight, those
queued (held for its start or for a slot), and when idle: what its idle stop will do
(`idle.action`: sleep, stop) and the time until it (`idle_ttl_s`), `-` when none counts
down (pinned, no idle_ttl_s, not ready, or busy).

`start` and `load` wait until the backend is ready (a start takes what a wake takes:
admission may evict idle models to make room), `stop` and `unload` until it is stopped
or asleep (requests in flight drain first); each prints the state.
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
    load = subparsers.add_parser(
        "load", help="load a model (start or wake it) and wait until it is ready"
    )
    load.add_argument("name", help="a model id or alias, or a backend (as in models.yaml)")
    load.add_argument("--no-wait", action="store_true", help="answer once the load has begun")
    add_call_options(load, timeout_s=DEFAULT_TIMEOUT_S, json_help="print the gateway's answer")
    load.set_defaults(func=run_load)
    unload = subparsers.add_parser(
        "unload", help="drain a model's requests, then sleep or stop it as its idle: says"
    )
    unload.add_argument("name", help="a model id or alias, or a backend (as in models.yaml)")
    add_call_options(unload, timeout_s=DEFAULT_TIMEOUT_S, json_help="print the gateway's answer")
    unload.set_defaults(func=run_unload)
    for verb, what in (("start", "start a backend, wait until it is ready (see load)"),
                       ("stop", "drain a backend, then stop it (see unload)")):  # fmt: skip
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


def run_load(args: argparse.Namespace) -> int:
    body = {"model": args.name, "wait": not args.no_wait}
    return show(args, "load", "POST", "/models/load", render_model, timeout=args.timeout,
                body=body)  # fmt: skip


def run_unload(args: argparse.Namespace) -> int:
    body = {"model": args.name}
    return show(args, "unload", "POST", "/models/unload", render_model, timeout=args.timeout,
                body=body)  # fmt: skip


def render_model(answer: JsonDict) -> str:
    """`NAME: VALUE`, with a load's phase and share done, or the reason it is in its state:
    `qwen: loading (loading_weights, 40 %)`, `qwen: unloaded (stopped: unload)`."""
    status = answer.get("status") or {}
    line = f"{answer.get('model')}: {status.get('value', 'unknown')}"
    progress = status.get("progress")
    if progress is not None:
        return f"{line} ({progress.get('phase')}, {progress.get('percent')} %)"
    reason = status.get("reason")
    return line if reason is None else f"{line} ({reason})"


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
    rows = [
        ["backend", "state", "lifecycle", "GPUs", "VRAM MiB", "in flight", "queued", "when idle"]
    ]
    for b in backends:
        mib = held_mib(b)
        rows.append([b["name"], b["state"], b["lifecycle"], gpus_text(b),
                     "-" if mib is None else f"{mib:,}", str(b["in_flight"]), str(b["waiting"]),
                     when_idle(b)])  # fmt: skip
    return "\n".join(table(rows))


def gpus_text(backend: JsonDict) -> str:
    """`0,1`: the GPUs it holds memory on now (`gpus`); `-` when none."""
    gpus = backend.get("gpus")
    if not isinstance(gpus, list) or not gpus:  # a gateway before issue 37 said its config
        return "-"
    return ",".join(str(g) for g in gpus)


def placed_text(backend: JsonDict) -> str | None:
    """`on GPU 1: 18.2 GiB free, pack` for a backend placed at each start that holds its
    GPUs now (`placed_why`); None otherwise (a `gpus:` list says it all)."""
    why = backend.get("placed_why")
    if not why or isinstance(backend.get("placement"), list) or not backend.get("gpus"):
        return None
    return f"placed {why}" if why.startswith("GPU") else str(why)


def when_idle(backend: JsonDict) -> str:
    """`sleep in 4m 12s` (or `stop in`, `sleep or stop in`: its `idle.action`, as the
    control page says it); `-` when no idle countdown runs."""
    left = backend.get("idle_stop_in_s")
    if left is None:
        return "-"
    action = (backend.get("idle") or {}).get("action") or "stop"
    return f"{action} in {countdown(left)}"
