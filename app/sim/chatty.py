"""A chatty server, for tests and `bench/chatty.py`: writes log lines to its stdout at a
set rate for a while, as vLLM does with DEBUG logging or `--enable-log-requests` echoing
prompts, or a crash loop printing tracebacks.

    python -m app.sim.chatty --mb-per-s 400 --seconds 30 [-- COMMAND...]

With a COMMAND (the fake vLLM, say) it runs that as its child first, sharing its stdout
and stderr, so the backend serves while it chatters; when the time is up it stops writing
and waits for the child (or, without one, sleeps until it is stopped), or with
`--then-exit` stops the child and exits (so a benchmark leaves nothing behind). `--mb-per-s 0`:
as fast as it can. It writes blocks of about 1 MiB of ~200-byte lines, each a whole number
of lines.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

LINE = (
    "DEBUG 11-29 02:00:00.000 [loggers.py:123] Received request chatcmpl-{n:012d}: "
    "prompt: 'Tell me about the history of the GPU, in detail, with dates and names.', "
    "params: SamplingParams(n=1, temperature=0.7), lora_request: None\n"
)
BLOCK_BYTES = 1 << 20


def block(start: int) -> bytes:
    """About `BLOCK_BYTES` of lines, numbered from `start`."""
    lines: list[str] = []
    size = 0
    while size < BLOCK_BYTES:
        line = LINE.format(n=start + len(lines))
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()


def chatter(mb_per_s: float, seconds: float, stats: Path | None = None) -> int:
    """Write for `seconds` at `mb_per_s` (0: unpaced); the bytes written (also written to
    `stats` about every 0.2 s)."""
    out = sys.stdout.fileno()
    data = block(0)
    written = 0
    began = told = time.monotonic()
    while (now := time.monotonic()) - began < seconds:
        if stats is not None and now - told >= 0.2:
            stats.write_text(str(written))
            told = now
        if mb_per_s > 0:
            ahead = written / (mb_per_s * 1e6) - (now - began)
            if ahead > 0:
                time.sleep(ahead)
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(out, view) :]
            except BrokenPipeError:
                return written
        written += len(data)
    if stats is not None:
        stats.write_text(str(written))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb-per-s", type=float, default=400.0, help="0: as fast as it can")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--stats", type=Path, help="a file to keep the bytes written in")
    parser.add_argument("--then-exit", action="store_true", help="exit when the time is up")
    parser.add_argument("command", nargs="*", help="a server to run beside (after --)")
    args = parser.parse_args(argv)
    child = subprocess.Popen(args.command) if args.command else None
    chatter(args.mb_per_s, args.seconds, args.stats)
    if child is not None and args.then_exit:
        child.terminate()
    if child is not None:
        return child.wait()
    if args.then_exit:
        return 0
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
