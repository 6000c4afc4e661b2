"""What held the event loop: run a Python module with its main thread's stack sampled.

    python -m bench.stallwatch OUT [--over-ms 4] MODULE [ARGS...]

runs `python -m MODULE ARGS` (e.g. `app.cli serve ...`) in this process, with a thread
that samples the main thread's stack every 0.5 ms. The main thread runs the event loop:
while it is inside one step of a task or one callback (the frames above asyncio's
`Runner.run`) for longer than `--over-ms`, that is a stall, and a line goes to OUT: how
long, and the stack seen most often during it (innermost frame first). A diagnostic for
`bench/looplag.py --stalls OUT`, not a measure: the sampling costs some CPU; a stall
whose thread waits for a CPU (a busy machine) shows the frame it was preempted in; and
steps of one task that follow each other closer than a sample (a stream relayed chunk
after chunk) are counted as one.
"""

from __future__ import annotations

import collections
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from types import FrameType

EVERY_S = 0.0005
DEPTH = 12  # frames kept of each stack
Stack = tuple[str, ...]


def loop_step(frame: FrameType | None) -> tuple[int, Stack] | None:
    """The step the loop runs (its outermost frame's id, and the innermost `DEPTH` frames
    of the stack), or None when the loop waits (no frame above `Runner.run`)."""
    stack: list[FrameType] = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    for k, f in enumerate(stack):
        if f.f_code.co_name == "run" and f.f_code.co_filename.endswith("asyncio/runners.py"):
            if k == 0:
                return None
            return id(stack[k - 1]), tuple(where(f) for f in stack[: min(k, DEPTH)])
    return None


def where(frame: FrameType) -> str:
    path = frame.f_code.co_filename
    for cut in ("site-packages/", f"{Path.cwd()}/"):
        path = path.split(cut)[-1]
    return f"{path}:{frame.f_lineno} {frame.f_code.co_name}"


def watch(out: Path, over_s: float, main_id: int) -> None:
    current: int | None = None
    since = 0.0
    seen: collections.Counter[Stack] = collections.Counter()
    with out.open("a", buffering=1) as file:
        while True:
            time.sleep(EVERY_S)
            step = loop_step(sys._current_frames().get(main_id))
            now = time.monotonic()
            key = None if step is None else step[0]
            if key != current:
                if current is not None and now - since > over_s and seen:
                    stack = seen.most_common(1)[0][0]
                    file.write(f"stall {1000 * (now - since):.1f} ms at {time.time():.3f}\n")
                    file.write("".join(f"  {line}\n" for line in stack))
                current, since = key, now
                seen.clear()
            if step is not None:
                seen[step[1]] += 1


def summary(path: Path, top: int = 8) -> list[str]:
    """The stalls of an OUT file by where they were (the innermost frame in `app/`, else
    the innermost): count, longest and total, the longest first."""
    places: dict[str, list[float]] = collections.defaultdict(list)
    took = 0.0
    stack: list[str] = []

    def add() -> None:
        if stack:
            mine = [line for line in stack if line.startswith("app/")]
            places[(mine or stack)[0]].append(took)

    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("stall "):
            add()
            took, stack = float(line.split()[1]), []
        else:
            stack.append(line.strip())
    add()
    ranked = sorted(places.items(), key=lambda kv: -max(kv[1]))[:top]
    return [
        f"{len(ms)} x, longest {max(ms):.1f} ms, total {sum(ms):.0f} ms: {place}"
        for place, ms in ranked
    ]


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    out = Path(args.pop(0))
    over_ms = 4.0
    if args[0] == "--over-ms":
        over_ms = float(args[1])
        args = args[2:]
    module, rest = args[0], args[1:]
    main_id = threading.get_ident()
    thread = threading.Thread(
        target=watch, args=(out, over_ms / 1000, main_id), name="stallwatch", daemon=True
    )
    thread.start()
    sys.argv = [module, *rest]
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
