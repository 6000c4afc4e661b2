"""The relay between a process backend's server and its output file:

    python -m app.runtimes.output_relay PATH [--cap BYTES] [--bytes-per-s N] ...

The server's stdout and stderr are the write end of a pipe whose read end is this
process's stdin. It writes what `app.runtimes.output_limits.OutputGate` keeps to PATH
(mode 0600), rotating it to `PATH.1` (replacing the last one) before it would pass `--cap`
bytes: at most two files of at most the cap each, enforced as bytes are written.

- Started by the gateway in a session of its own, beside the server: it outlives a gateway
  crash (the next gateway adopts the server and reads the same file), and the gateway's
  SIGTERM and SIGKILL to the server's process group do not reach it, so it writes the
  server's last words.
- It ignores SIGTERM, SIGINT and SIGHUP and ends when the pipe closes: when the server and
  every child holding its stdout have exited. So it never keeps a server alive, and never
  dies before it (a server whose stdout reader died would get EPIPE, or SIGPIPE).
- It reads as fast as the server writes, in reads of up to `READ_BYTES`; above the budget
  it drops (which costs a count of the lines), it never stalls to catch up. It runs at
  `NICE` 10, so on a busy machine the gateway's loop gets the CPU first; a server that
  writes faster than the relay reads (a few hundred MB/s, less when the CPUs are busy)
  fills the pipe and waits in its write: back-pressure, at a rate no log has a use for.
- A write that fails (disk full) is given up: the output is lost, the server goes on. A
  file it cannot open, or a fault of its own, leaves it reading the pipe to its end,
  keeping nothing, rather than leave the server writing into a pipe nobody reads.

It imports nothing but the standard library and `output_limits`, to start in tens of
milliseconds and stay a few MB.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Final

from app.runtimes.output_limits import Limits, OutputGate, cap_split

READ_BYTES: Final = 1024 * 1024
PIPE_BYTES: Final = 1024 * 1024  # asked of the kernel (F_SETPIPE_SZ); 64 KiB otherwise
FILE_MODE: Final = 0o600
NICE: Final = 10  # below the gateway (and the server): on a busy machine they come first


class CappedFile:
    """PATH, rotated to PATH.1 before it would pass `cap` bytes."""

    def __init__(self, path: Path, cap: int) -> None:
        self._path = path
        self._cap = cap
        self._fd = self._open(os.O_APPEND)  # an earlier run's output stays before this one
        self._size = os.fstat(self._fd).st_size

    def _open(self, flags: int) -> int:
        return os.open(self._path, os.O_WRONLY | os.O_CREAT | flags, FILE_MODE)

    def write(self, data: bytes) -> None:
        while data:
            n = cap_split(self._size, data, self._cap)
            if n == 0:
                self._rotate()
                continue
            self._write_all(data[:n])
            data = data[n:]

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._fd, view)
            except InterruptedError:
                continue
            except OSError:
                return  # disk full, file gone...: this output is lost
            view = view[written:]
            self._size += written

    def _rotate(self) -> None:
        with contextlib.suppress(OSError):
            os.replace(self._path, self._path.with_name(self._path.name + ".1"))
        os.close(self._fd)
        try:
            self._fd = self._open(os.O_TRUNC)
        except OSError:
            self._fd = os.open(os.devnull, os.O_WRONLY)  # nowhere to write: drop
        self._size = 0

    def close(self) -> None:
        os.close(self._fd)


def relay(source: int, out: CappedFile, limits: Limits) -> None:
    """Copy `source` (until its end) to `out` through an `OutputGate`."""
    gate = OutputGate(limits, time.monotonic())
    while True:
        wait = gate.wait_s(time.monotonic())
        if wait is not None and not select.select([source], [], [], wait)[0]:
            out.write(gate.due(time.monotonic()))  # quiet after drops: say so now
            continue
        try:
            data = os.read(source, READ_BYTES)
        except InterruptedError:
            continue
        now = time.monotonic()
        if not data:
            out.write(gate.close(now))
            return
        out.write(gate.feed(data, now))
        out.write(gate.due(now))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a server's output, capped and rate-limited")
    parser.add_argument("path", type=Path)
    parser.add_argument("--cap", type=int, default=16 * 1024 * 1024)
    defaults = Limits()
    parser.add_argument("--bytes-per-s", type=float, default=defaults.bytes_per_s)
    parser.add_argument("--lines-per-s", type=float, default=defaults.lines_per_s)
    parser.add_argument("--burst-bytes", type=float, default=defaults.burst_bytes)
    parser.add_argument("--burst-lines", type=float, default=defaults.burst_lines)
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(NICE)
    source = sys.stdin.fileno()
    with contextlib.suppress(OSError):
        fcntl.fcntl(source, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    limits = Limits(args.bytes_per_s, args.lines_per_s, args.burst_bytes, args.burst_lines)
    try:
        out = CappedFile(args.path, max(1, args.cap))
    except OSError as exc:
        print(f"output relay: cannot write {args.path}: {exc}", file=sys.stderr)
        drain(source)
        return 1
    try:
        relay(source, out, limits)
    except Exception:
        drain(source)  # whatever went wrong here, the server's writes must not fail
        raise
    finally:
        out.close()
    return 0


def drain(source: int) -> None:
    """Read `source` to its end, keeping nothing."""
    while True:
        try:
            if not os.read(source, READ_BYTES):
                return
        except InterruptedError:
            continue
        except OSError:
            return


if __name__ == "__main__":
    sys.exit(main())
