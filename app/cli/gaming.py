"""`microscheduler yield [-- CMD ...]` and `microscheduler restore`: the GPU for a game.

    microscheduler yield                      # free the GPU; restore later by hand
    microscheduler yield -- %command%         # Steam launch option: free, play, restore
    microscheduler yield --host node-c        # the GPU of another machine of `hosts:`

`yield` asks the gateway (`POST /vram/yield`), which drains and stops (or puts to sleep)
the yieldable backends and answers once the probe shows the memory free. With
`--min-free-mib N`, the gateway gives the verdict (the control page shows the same): N
beyond the GPU's memory is refused before anything stops (HTTP 400), and N not reached
is undone by the gateway and refused (HTTP 409, saying what still holds the GPU); the
exit code is 1.

Each caller holds the yield on its own, by its `--reason` (default `gaming`): a yield
taken while one holds (a schedule's window, another person's) adds this hold to it. With
a command, it runs the command once the memory is free and lets go of its own hold when
the command ends (`POST /vram/restore` with its reason; the models come back when no other
hold remains), whatever the end: its own exit, a crash, Ctrl-C (the command gets it too,
as the terminal sends it to both), or SIGTERM to this process (passed on to the command).
The exit code is the command's (128 + N for a signal N), 127 when it cannot be started.

The command always runs: a game must start from its launcher whatever the gateway's
state. When the yield cannot be had (the gateway is down, refuses the admin key or the
call, the key file cannot be read, `--min-free-mib` is not reached), a `warning: yield:`
line on stderr says why and that the command starts anyway; it runs on the GPU as it
is, nothing is restored after it, and the exit code is still the command's. Without a
command those are failures (exit 1, 2 or 3, as every command).

`restore` ends every hold ("give it all back"); `restore --reason R` only R's.

`--host NAME` (both commands) acts on the GPU of that machine of models.yaml `hosts:`
instead of the gateway's own (`local`); the output names it.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from app.cli.admin_key import KeyFileError
from app.cli.common import OK, Subparsers, error, positive_int, seconds
from app.cli.gateway import (
    GatewayRefused,
    JsonDict,
    Unreachable,
    add_url_option,
    call,
    reported,
    url_of,
)
from app.settings import LOCAL_HOST

# The gateway drains requests in flight before it stops a backend: give it time.
YIELD_TIMEOUT_S = 900.0
RESTORE_TIMEOUT_S = 900.0


def add_gaming_commands(subparsers: Subparsers) -> None:
    take = subparsers.add_parser(
        "yield",
        help="free the GPU (for a game); with -- CMD, run it and restore when it ends",
        description="Free the GPU for a game; with -- CMD, run it and restore when it ends.",
        # Shown as written (a raw epilog, not %-formatted: one % shows as one).
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "As a Steam launch option, with the executable's full path:\n"
            "  /home/you/microscheduler/.venv/bin/microscheduler yield -- %command%\n"
            "The command always runs: when the GPU cannot be freed, a warning says why.\n"
            "The admin key: --admin-key-file, $MICROSCHEDULER_ADMIN_KEY, or the file\n"
            "~/.config/microscheduler/admin.key (Steam does not pass your shell's variables)."
        ),
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
    _add_host_option(take)
    take.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
        help="run it once the memory is free (or, with a warning, when it cannot be), "
        "restore when it ends (exit code: its own)",
    )  # fmt: skip
    take.set_defaults(func=run_yield)

    restore = subparsers.add_parser("restore", help="end the yield: bring the models back")
    add_url_option(restore)
    _add_host_option(restore)
    restore.add_argument(
        "--reason", default=None, metavar="R",
        help="let go of R's hold only (the yield ends when no hold remains); default: every hold",
    )  # fmt: skip
    restore.set_defaults(func=run_restore)


def _add_host_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default=None, metavar="NAME",
        help="the machine of models.yaml hosts: whose GPU (default: the gateway's own, local)",
    )  # fmt: skip


def _on(host: Any) -> str:
    """' on node-c' for another host, '' for the local one (the output as without hosts:)."""
    return "" if host in (None, LOCAL_HOST) else f" on {host}"


# -- output --------------------------------------------------------------------------------


def _names(items: Any) -> str:
    return ", ".join(str(i) for i in items) if items else "-"


def yield_summary(body: JsonDict) -> str:
    freed, free = body.get("freed_mib"), body.get("free_mib")
    gpu = f"GPU {body.get('gpu', 0)}"
    if _on(body.get("host")):
        gpu = f"{body['host']} {gpu}"  # as the gateway names it: "node-c GPU 0"
    lines = [
        "yielded" + (" (already held)" if body.get("already") else "")
        + f" for {body.get('reason')!r} on {gpu}: "
        + (f"freed {freed:,} MiB, " if freed is not None else "")
        + (f"{free:,} MiB free" if free is not None else "free memory unknown (no GPU probe)"),
        f"stopped: {_names(body.get('stopped'))}; slept: {_names(body.get('slept'))}",
    ]  # fmt: skip
    if body.get("already_asleep"):  # asleep before the yield: freed nothing by it
        lines.append(f"already asleep: {_names(body['already_asleep'])}")
    if body.get("failed"):
        lines.append("could not stop: " + "; ".join(f"{k}: {v}" for k, v in body["failed"].items()))
    if body.get("drain_timeouts"):
        lines.append(f"requests cut after the drain timeout: {_names(body['drain_timeouts'])}")
    return "\n".join(lines)


def restore_summary(body: JsonDict) -> str:
    where = _on(body.get("host"))
    if not body.get("restored") and body.get("state") == "yielded":  # others hold on
        holders = _names(body.get("holders"))
        if not body.get("released"):
            return f"{body.get('reason')!r} held no yield{where}; it holds for {holders}"
        mine = f"{body.get('reason')!r}{where}"
        return f"let go of the hold of {mine}; the yield holds on for {holders}"
    if not body.get("restored"):
        return f"no yield was held{where}: nothing to restore"
    return (
        f"restored{where}: back {_names(body.get('back'))}; "
        f"starting {_names(body.get('starting'))}; "
        f"on demand {_names(body.get('on_demand'))}"
        + (f"; woken in this order: {_names(body['order'])}" if body.get("order") else "")
        + ("; failed " + "; ".join(f"{k}: {v}" for k, v in body["failed"].items())
           if body.get("failed") else "")
    )  # fmt: skip


# -- commands ------------------------------------------------------------------------------


def run_restore(args: argparse.Namespace) -> int:
    url = url_of(args)
    try:
        body = call(
            "POST", url, "/vram/restore", timeout=RESTORE_TIMEOUT_S,
            body=_restore_body(args.host, args.reason), key_file=args.admin_key_file,
        )  # fmt: skip
    except (Unreachable, GatewayRefused) as exc:
        return reported("restore", exc)
    print(restore_summary(body))
    return OK


def run_yield(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    url, key_file = url_of(args), args.admin_key_file
    request: JsonDict = {"reason": args.reason, "include_pinned": args.include_pinned}
    if args.min_free_mib is not None:
        request["min_free_mib"] = args.min_free_mib
    if args.ttl is not None:
        request["ttl_s"] = args.ttl
    request.update(_host(args.host) or {})
    try:
        body = call(
            "POST", url, "/vram/yield", timeout=YIELD_TIMEOUT_S, body=request, key_file=key_file
        )
    except (Unreachable, GatewayRefused, KeyFileError) as exc:
        if not command:
            if isinstance(exc, KeyFileError):
                raise  # exit 2, as for every command (app.cli.main)
            return reported("yield", exc)
        _play_anyway(_why_not(exc))
        return _run_then(command, _nothing)
    print(yield_summary(body))
    restore = partial(_restore_quietly, url, args.host, args.reason, key_file)
    if not command:
        if body.get("already"):  # others hold it too: let go of this hold, or of all
            print(f"let go of this hold with: {_restore_command(args.host, args.reason)}; "
                  f"end every hold: {_restore_command(args.host)}")  # fmt: skip
        else:
            print(f"restore with: {_restore_command(args.host)}")
        return OK
    try:
        return _run_then(command, restore)
    finally:
        sys.stdout.flush()


def _why_not(problem: Unreachable | GatewayRefused | KeyFileError) -> str:
    if isinstance(problem, GatewayRefused):
        return f"the gateway refused it: {problem} (HTTP {problem.status})"
    return str(problem)


def _play_anyway(why: str) -> None:
    """The warning for a command run without the yield (never the admin key: the
    messages name where it came from)."""
    print(
        f"warning: yield: the GPU was not freed ({' '.join(why.split())}); "
        "starting the command anyway",
        file=sys.stderr,
        flush=True,
    )


def _nothing() -> None:
    """What ends a command run without a yield: nothing to restore."""


def _host(host: str | None) -> JsonDict | None:
    """The body naming the host (none: the gateway's default, the local one)."""
    return None if host is None else {"host": host}


def _restore_body(host: str | None, reason: str | None) -> JsonDict | None:
    """The restore's body: the host (none: the local one), the hold to end (none: all)."""
    body = {**(_host(host) or {}), **({} if reason is None else {"reason": reason})}
    return body or None


def _restore_command(host: str | None, reason: str | None = None) -> str:
    return (
        "microscheduler restore"
        + ("" if host is None else f" --host {host}")
        + ("" if reason is None else f" --reason {shlex.quote(reason)}")
    )


def _run_then(command: Sequence[str], restore: Callable[[], None]) -> int:
    """Run `command` to its end, then `restore` (also when it cannot be started); its
    exit code (128 + N for a signal N, 127 when it cannot be started)."""
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        error("yield", f"cannot run {command[0]!r}: {exc.strerror or exc}")
        restore()
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
        restore()
    return 128 - code if code < 0 else code


def _restore_quietly(url: str, host: str | None, reason: str, key_file: Path | None) -> None:
    """Let go of this yield's own hold (`reason`; another's, a schedule's, stays), saying
    what happened; a failure is printed, never raised (the command's exit code is what the
    caller returns)."""
    try:
        body = call(
            "POST", url, "/vram/restore", timeout=RESTORE_TIMEOUT_S,
            body=_restore_body(host, reason), key_file=key_file,
        )  # fmt: skip
        print(restore_summary(body))
    except (Unreachable, GatewayRefused, KeyFileError) as exc:
        error("yield", f"the restore failed: {exc}; run: {_restore_command(host, reason)}")
