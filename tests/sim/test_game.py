"""The fake game: foreign memory on the simulated GPU while it runs, none after."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from app.gpu.ledger import read_ledger
from tests.fakes.processes import ROOT
from tests.fakes.waits import until_sync


def test_the_game_holds_its_memory_until_it_is_stopped(tmp_path: Path) -> None:
    game = subprocess.Popen(
        [sys.executable, "-m", "app.sim.game", "--sim-gpu-dir", str(tmp_path), "--mib", "12000"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        until_sync(lambda: read_ledger(tmp_path, now=time.time()) == {0: 12000}, what="the game")
    finally:
        game.send_signal(signal.SIGTERM)
        out, _ = game.communicate(timeout=10)
    assert game.returncode == 0
    assert out.splitlines() == ["game: using 12000 MiB on simulated GPU 0", "game: ended"]
    assert read_ledger(tmp_path, now=time.time()) == {}


def test_bad_sizes_are_usage_errors(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app.sim.game", "--sim-gpu-dir", str(tmp_path), "--mib", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--mib must be positive" in done.stderr
