"""`microscheduler status [--watch]`: the gateway's GPUs and backends as a compact table.

With models.yaml `hosts:`, the GPUs, the yields and the zones of every host, and a host
column for the backends.

The backends' `GPUs` are those each holds memory on now and `VRAM MiB` what it holds on
each, as `ps` shows them (`held_mib`: asleep, what it kept; `-` when it holds none); for
a backend placed at each start (`gpus: auto` or a count), `why` says why it went there
(`placed GPU 1: 18.2 GiB free, pack`).

`--watch` follows `GET /status/stream` and prints the table again on every change (in
place on a terminal) until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.cli.backends import gpus_text, held_mib, placed_text
from app.cli.common import OK, UNREACHABLE, Subparsers, error
from app.cli.common import table as _table
from app.cli.gateway import (
    GatewayRefused,
    JsonDict,
    Unreachable,
    add_url_option,
    follow,
    reported,
    show,
    url_of,
)

CLEAR = "\x1b[H\x1b[2J"


def add_status_command(subparsers: Subparsers) -> None:
    status = subparsers.add_parser("status", help="the gateway's GPUs and backends, compactly")
    add_url_option(status)
    status.add_argument("--watch", action="store_true", help="follow the live status")
    status.add_argument("--json", action="store_true", help="print the /status document")
    status.set_defaults(func=run_status)


def _load(load: JsonDict | None) -> str | None:
    """`loading_weights 40%, ~12 s left` while a backend starts."""
    if not load:
        return None
    eta = load.get("eta_s")
    left = "" if eta is None else f", ~{eta} s left"
    return f"{load.get('phase')} {load.get('percent')}%{left}"


def _why(backend: JsonDict) -> str:
    """What it waits for or why it is in its state, and why it sits on its GPUs."""
    reasons = [_load(backend.get("load")), backend.get("starting"), backend.get("reason"),
               *(backend.get("blocked_by") or []), placed_text(backend)]  # fmt: skip
    return "; ".join(x for x in reasons if x) or "-"


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def render(status: JsonDict, url: str) -> str:
    hosts = status.get("hosts") or []
    if len(hosts) > 1:
        return _render_hosts(status, hosts, url)
    lines = [f"gateway {url}"]
    gpu = status.get("gpu", {})
    if gpu.get("gpus"):
        rows = [["GPU", "name", "used MiB", "total MiB", "free MiB"]]
        for g in gpu["gpus"]:
            rows.append([str(g["index"]), g["name"], _mib(g["used_mib"]), _mib(g["total_mib"]),
                         _mib(g["free_mib"])])  # fmt: skip
        lines += _table(rows)
    else:
        lines.append(f"GPU: {gpu.get('error') or 'no telemetry (gpu.probe: none)'}")
    held = status.get("holds", {}).get("yield", {})
    if held.get("state") == "yielded":
        lines.append(
            f"yield: held for {held.get('reason')!r}, {_mib(held.get('free_mib'))} MiB free"
        )
    for zone in status.get("holds", {}).get("zones", []):
        lines.append(f"zone {zone['zone']}: {_mib(zone['mib'])} MiB for {zone['holder']}")
    rows = [["backend", "state", "lifecycle", "in flight", "waiting", "GPUs", "VRAM MiB", "why"]]
    for b in status.get("backends", []):
        mib = held_mib(b)
        rows.append([b["name"], b["state"], b["lifecycle"], str(b["in_flight"]),
                     str(b["waiting"]), gpus_text(b), _mib(mib), _why(b)])  # fmt: skip
    lines.append("")
    lines += _table(rows)
    return "\n".join(lines)


def _probe_state(host: JsonDict) -> str:
    gpu = host.get("gpu", {})
    if host.get("probe") == "none":
        return "none"
    if not gpu.get("up"):
        return f"{host.get('probe')} (down)"
    return f"{host.get('probe')} (stale)" if gpu.get("stale") else str(host.get("probe"))


def _render_hosts(status: JsonDict, hosts: list[JsonDict], url: str) -> str:
    """`render` with more than one host: a GPU table with a host column (each host's probe,
    down or stale), each host's yield and zones, the host of each backend."""
    lines = [f"gateway {url}"]
    rows = [["host", "probe", "GPU", "name", "used MiB", "total MiB", "free MiB"]]
    blind = []
    for host in hosts:
        gpus = host.get("gpu", {}).get("gpus") or []
        for g in gpus:
            used, total, free = (_mib(g[k]) for k in ("used_mib", "total_mib", "free_mib"))
            rows.append(
                [host["name"], _probe_state(host), str(g["index"]), g["name"], used, total, free]
            )
        if not gpus:
            why = host.get("gpu", {}).get("error") or "no telemetry (gpu.probe: none)"
            blind.append(f"host {host['name']}: GPU: {why}")
    if len(rows) > 1:
        lines += _table(rows)
    lines += blind
    for host in hosts:
        held = host.get("holds", {}).get("yield", {})
        if held.get("state") == "yielded":
            lines.append(
                f"yield on {host['name']}: held for {held.get('reason')!r}, "
                f"{_mib(held.get('free_mib'))} MiB free"
            )
        for zone in host.get("holds", {}).get("zones", []):
            lines.append(
                f"zone {zone['zone']} on {host['name']}: {_mib(zone['mib'])} MiB "
                f"for {zone['holder']}"
            )
    rows = [
        ["backend", "host", "state", "lifecycle", "in flight", "waiting", "GPUs", "VRAM MiB", "why"]
    ]
    for b in status.get("backends", []):
        mib = held_mib(b)
        rows.append([b["name"], b.get("host") or "cluster", b["state"], b["lifecycle"],
                     str(b["in_flight"]), str(b["waiting"]), gpus_text(b), _mib(mib),
                     _why(b)])  # fmt: skip
    lines.append("")
    lines += _table(rows)
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    url = url_of(args)
    if not args.watch:
        return show(args, "status", "GET", "/status", lambda status: render(status, url))
    try:
        return _watch(url, args.admin_key_file, json_lines=args.json)
    except (Unreachable, GatewayRefused) as exc:
        return reported("status", exc)


def _watch(url: str, key_file: Path | None, *, json_lines: bool) -> int:
    status: JsonDict = {}
    in_place = sys.stdout.isatty()
    shown = ""
    try:
        for event, data in follow(url, "/status/stream", key_file):
            if event == "snapshot":
                status = data
            elif event != "event" and event in status:
                status[event] = data
            else:
                continue
            text = json.dumps(status) if json_lines else render(status, url)
            if text == shown:
                continue  # the GPU sample's age moved, nothing the table shows
            shown = text
            prefix = "" if json_lines else (CLEAR if in_place else "\n")
            print(prefix + text, flush=True)
    except KeyboardInterrupt:
        return OK
    error("status", f"the gateway at {url} ended the stream")
    return UNREACHABLE
