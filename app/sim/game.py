"""A fake game on the simulated GPU: memory the gateway does not manage.

    python -m app.sim.game --sim-gpu-dir var/sim-gpu --mib 12000 [--gpu 0] [--seconds 60]

It reports `--mib` on the simulated GPU's ledger (as NVML would see a game's process)
until it is stopped (Ctrl-C, SIGTERM) or `--seconds` pass, then removes its entry. With
`gpu.auto_yield.enabled`, the gateway sees foreign memory and yields; when the game ends,
it restores. A killed game's entry lapses by itself (heartbeat, `app/gpu/ledger.py`).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from app.gpu.ledger import LedgerWriter

HEARTBEAT_S = 1.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app.sim.game", description=__doc__)
    parser.add_argument("--sim-gpu-dir", type=Path, required=True, help="the ledger directory")
    parser.add_argument("--mib", type=int, required=True, help="MiB the game uses")
    parser.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    parser.add_argument("--seconds", type=float, default=None, help="end after S seconds")
    args = parser.parse_args(argv)
    if args.mib <= 0:
        parser.error(f"--mib must be positive, got {args.mib}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    done = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    writer = LedgerWriter(args.sim_gpu_dir, pid=os.getpid(), gpus=[args.gpu], model="game",
                          port=None)  # fmt: skip
    writer.set_mib(args.mib)
    print(f"game: using {args.mib} MiB on simulated GPU {args.gpu}", flush=True)
    waited = 0.0
    try:
        while not done.wait(HEARTBEAT_S):
            writer.heartbeat()
            waited += HEARTBEAT_S
            if args.seconds is not None and waited >= args.seconds:
                break
    finally:
        writer.remove()
        print("game: ended", flush=True)


if __name__ == "__main__":
    main()
