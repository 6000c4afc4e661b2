"""`microscheduler profile list | activate NAME`: the GPU profiles of a running gateway.

Calls the gateway's admin API (`app.cli.gateway`): `GET /profiles` and
`POST /profiles/{name}/activate`. `--json` prints the gateway's answer.

Exit codes (`app.cli.common`): 0 on success; 1 when the gateway answered with an error (its
message is printed, e.g. an unknown profile); 3 when it cannot be reached (the URL and the
error are printed); 2 for arguments it cannot use. To check a profile offline instead, use
`microscheduler plan profile`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import quote

from app.cli.common import Subparsers
from app.cli.gateway import JsonDict, add_call_options, show, url_of

# Activation drains, stops and starts backends before it answers: give it time.
DEFAULT_TIMEOUT_S = 900.0


def add_profile_command(subparsers: Subparsers) -> None:
    """Add `profile` with its `list` and `activate` sub-commands."""
    profile = subparsers.add_parser(
        "profile",
        help="list or activate the GPU profiles of a running gateway",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    commands = profile.add_subparsers(
        dest="profile_command", metavar="{list,activate}", required=True
    )
    listing = commands.add_parser("list", help="the profiles and which one is active")
    _add_common(listing)
    listing.set_defaults(func=run_list)
    activate = commands.add_parser(
        "activate",
        help="switch to a profile: stop what it disables, make startable what it enables",
    )
    activate.add_argument("name", help="the profile to activate")
    _add_common(activate)
    activate.set_defaults(func=run_activate)


def _add_common(parser: argparse.ArgumentParser) -> None:
    add_call_options(
        parser, timeout_s=DEFAULT_TIMEOUT_S, json_help="print the gateway's JSON answer"
    )


def _run(
    args: argparse.Namespace, method: str, path: str, render: Callable[[JsonDict, str], str]
) -> int:
    url = url_of(args)
    where = f"profile {args.profile_command}"
    return show(args, where, method, path, lambda body: render(body, url), timeout=args.timeout)


# --------------------------------------------------------------------------- output


def _names(value: object) -> str:
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping):
        items = [str(item) for item in value]
        return ", ".join(items) if items else "-"
    return "-" if value in (None, "") else str(value)


def _model_summary(models: object) -> str:
    if not isinstance(models, Mapping) or not models:
        return "-"
    parts = []
    for name, spec in models.items():
        spec = spec if isinstance(spec, Mapping) else {}
        bits = []
        if spec.get("enabled") is False:
            bits.append("off")
        if spec.get("vram_pct") is not None:
            bits.append(f"{spec['vram_pct']:g}%")
        if spec.get("cuda_graphs") is False:
            bits.append("eager")
        if spec.get("sleep_mode") is True:
            bits.append("sleep")
        parts.append(f"{name} {' '.join(bits)}".rstrip())
    return ", ".join(parts)


def _number(value: object, suffix: str = "") -> str:
    return f"{value:g}{suffix}" if isinstance(value, int | float) else "-"


def render_list(body: JsonDict, url: str) -> str:
    profiles = body.get("profiles")
    rows = [p for p in profiles if isinstance(p, Mapping)] if isinstance(profiles, list) else []
    header = ["", "profile", "strategy", "GPU GiB", "target", "enabled", "disabled", "models"]
    table = [header] + [
        [
            "*" if p.get("active") else "",
            str(p.get("name", "?")),
            str(p.get("vram_strategy") or "-"),
            _number(p.get("gpu_total_gb")),
            _number(p.get("target_utilization_pct"), "%"),
            _names(p.get("enabled")),
            _names(p.get("disabled")),
            _model_summary(p.get("models")),
        ]
        for p in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [f"gateway {url}: active profile {body.get('active') or '-'}", ""]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]
    described = [(p.get("name"), p.get("description")) for p in rows if p.get("description")]
    if described:
        lines.append("")
        lines += [f"{name}: {text}" for name, text in described]
    return "\n".join(lines)


def render_activation(body: JsonDict, url: str) -> str:
    previous = body.get("previous")
    lines = [
        f"gateway {url}: active profile {body.get('active') or '-'}"
        + (f" (was {previous})" if previous else ""),
        f"stopped: {_names(body.get('stopped'))}",
        f"started: {_names(body.get('started'))}",
        f"disabled: {_names(body.get('disabled'))}",
        f"enabled: {_names(body.get('enabled'))}",
    ]
    if body.get("drain_timeouts"):
        lines.append(f"drain timed out (requests cut): {_names(body.get('drain_timeouts'))}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- commands


def run_list(args: argparse.Namespace) -> int:
    """`profile list`: the gateway's profiles, the active one marked with `*`."""
    return _run(args, "GET", "/profiles", render_list)


def run_activate(args: argparse.Namespace) -> int:
    """`profile activate NAME`: switch the gateway to a profile and say what changed."""
    path = f"/profiles/{quote(args.name, safe='')}/activate"
    return _run(args, "POST", path, render_activation)
