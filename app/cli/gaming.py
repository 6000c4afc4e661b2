"""`microscheduler yield [-- CMD ...]` and `microscheduler restore`: the GPU for a game.

    microscheduler yield                      # free the GPU; restore later by hand
    microscheduler yield -- %command%         # Steam launch option: free, play, restore

`yield` asks the gateway (`POST /vram/yield`), which drains and stops (or puts to sleep)
the yieldable backends and answers once the probe shows the memory free. With
`--min-free-mib N`, not reaching N is a failure: what still holds the GPU is printed,
the yield is undone and the exit code is 1 (no game starts on a GPU that is still full).

With a command, it runs the command once the memory is free and restores when the
command ends, whatever the end: its own exit, a crash, Ctrl-C (the command gets it too,
as the terminal sends it to both), or SIGTERM to this process (passed on to the command).
The exit code is the command's (128 + N for a signal N), 127 when it cannot be started.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from app.cli.common import FAILED, OK, error, positive_int, seconds
from app.cli.gateway import (
    GatewayRefused,
    JsonDict,
    Unreachable,
    add_url_option,
    call,
    reported,
    url_of,
)

# The gateway drains requests in flight before it stops a backend: give it time.
YIELD_TIMEOUT_S = 900.0
RESTORE_TIMEOUT_S = 900.0


def add_gaming_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    take = subparsers.add_parser(
        "yield",
        help="free the GPU (for a game); with -- CMD, run it and restore when it ends",
        description="Free the GPU for a game; with -- CMD, run it and restore when it ends.",
        epilog="Example (Steam launch option): microscheduler yield -- %%command%%",
    )
    add_url_option(take)
    take.add_argument(
        "--min-free-mib", type=positive_int, default=None, metavar="N",
        help="fail (exit 1, undone) unless N MiB are free afterwards",
    )  # fmt: skip
    take.add_argument(
        "--include-pinned", action="store_true",
        help="also stop the backends the gateway keeps running (pinned)",
    )  # fmt: skip
    take.add_argument(
        "--ttl", type=seconds, default=None, metavar="S",
        help="restore by itself after S seconds (default: when restored)",
    )  # fmt: skip
    take.add_argument("--reason", default="gaming", help="shown in /status (default gaming)")
    take.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
        help="run it once the memory is free, restore when it ends (exit code: its own)",
    )  # fmt: skip
    take.set_defaults(func=run_yield)

    restore = subparsers.add_parser("restore", help="end the yield: bring the models back")
    add_url_option(restore)
    restore.set_defaults(func=run_restore)


# -- output --------------------------------------------------------------------------------


def _names(items: Any) -> str:
    return ", ".join(str(i) for i in items) if items else "-"


def yield_summary(body: JsonDict) -> str:
    freed, free = body.get("freed_mib"), body.get("free_mib")
    lines = [
        "yielded" + (" (already held)" if body.get("already") else "")
        + f" for {body.get('reason')!r} on GPU {body.get('gpu', 0)}: "
        + (f"freed {freed:,} MiB, " if freed is not None else "")
        + (f"{free:,} MiB free" if free is not None else "free memory unknown (no GPU probe)"),
        f"stopped: {_names(body.get('stopped'))}; slept: {_names(body.get('slept'))}",
    ]  # fmt: skip
    if body.get("failed"):
        lines.append("could not stop: " + "; ".join(f"{k}: {v}" for k, v in body["failed"].items()))
    if body.get("drain_timeouts"):
        lines.append(f"requests cut after the drain timeout: {_names(body['drain_timeouts'])}")
    return "\n".join(lines)


def restore_summary(body: JsonDict) -> str:
    if not body.get("restored"):
        return "no yield was held: nothing to restore"
    return (
        f"restored: back {_names(body.get('back'))}; starting {_names(body.get('starting'))}; "
        f"on demand {_names(body.get('on_demand'))}"
        + ("; failed " + "; ".join(f"{k}: {v}" for k, v in body["failed"].items())
           if body.get("failed") else "")
    )  # fmt: skip


def _holders(url: str) -> str:
    """What still uses the GPU, from /status: backends holding memory and other processes."""
    try:
        status = call("GET", url, "/status", timeout=10)
    except (Unreachable, GatewayRefused):
        return "(the status could not be read)"
    lines = []
    for gpu in status.get("gpu", {}).get("gpus", []):
        lines.append(f"GPU {gpu['index']}: {gpu['used_mib']:,} of {gpu['total_mib']:,} MiB used")
    for backend in status.get("backends", []):
        if backend.get("holds_vram"):
            why = "; ".join(backend.get("blocked_by") or []) or backend.get("state")
            lines.append(f"  {backend['name']} still holds memory ({why})")
    return "\n".join(lines)


# -- commands ------------------------------------------------------------------------------


def run_restore(args: argparse.Namespace) -> int:
    url = url_of(args)
    try:
        body = call("POST", url, "/vram/restore", timeout=RESTORE_TIMEOUT_S)
    except (Unreachable, GatewayRefused) as exc:
        return reported("restore", exc)
    print(restore_summary(body))
    return OK


def run_yield(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    url = url_of(args)
    request: JsonDict = {"reason": args.reason, "include_pinned": args.include_pinned}
    if args.min_free_mib is not None:
        request["min_free_mib"] = args.min_free_mib
    if args.ttl is not None:
        request["ttl_s"] = args.ttl
    try:
        body = call("POST", url, "/vram/yield", timeout=YIELD_TIMEOUT_S, body=request)
    except (Unreachable, GatewayRefused) as exc:
        return reported("yield", exc)
    print(yield_summary(body))
    if body.get("met") is False:
        error(
            "yield",
            f"only {body.get('free_mib'):,} MiB free, not the {args.min_free_mib:,} MiB asked "
            "for; what holds it:",
        )
        print(_holders(url), file=sys.stderr)
        _restore_quietly(url)
        return FAILED
    if not command:
        print("restore with: microscheduler restore")
        return OK
    try:
        return _run_then_restore(command, url)
    finally:
        sys.stdout.flush()


def _run_then_restore(command: Sequence[str], url: str) -> int:
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        error("yield", f"cannot run {command[0]!r}: {exc.strerror or exc}")
        _restore_quietly(url)
        return 127

    def pass_on(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, pass_on)
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:
                continue  # the terminal sent Ctrl-C to the command too: wait for its end
    finally:
        signal.signal(signal.SIGTERM, previous)
        _restore_quietly(url)
    return 128 - code if code < 0 else code


def _restore_quietly(url: str) -> None:
    """Restore, saying what happened; a failure is printed, never raised (the command's
    exit code is what the caller returns)."""
    try:
        print(restore_summary(call("POST", url, "/vram/restore", timeout=RESTORE_TIMEOUT_S)))
    except (Unreachable, GatewayRefused) as exc:
        error("yield", f"the restore failed: {exc}; run: microscheduler restore")
