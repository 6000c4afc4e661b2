"""`bench/overhead.py --quick` runs end to end: both servers start, every response is valid.

Timing targets are never asserted here; the quick counts are far too small to mean anything,
and CI machines are noisy. Without wrk the quick mode falls back to a Python load loop.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "overhead.py"

POSITIVE = {
    "sequential": ["direct_p50_ms", "gateway_p50_ms", "direct_p99_ms", "gateway_p99_ms"],
    "throughput": ["direct_rps", "gateway_rps", "ratio"],
    "streaming": [
        "direct_first_p50_ms",
        "gateway_first_p50_ms",
        "direct_end_p50_ms",
        "gateway_end_p50_ms",
    ],
}
# Differences: a number, but a noisy one that may come out at or below zero in a tiny run.
NUMBERS = {
    "sequential": ["added_p50_ms", "added_p99_ms"],
    "streaming": ["added_first_p50_ms", "added_end_p50_ms"],
}


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@pytest.mark.e2e
def test_quick_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "| Measurement |" in done.stdout

    results = json.loads(out.read_text())
    assert results["quick"] is True
    assert results["errors"] == 0
    for phase, keys in POSITIVE.items():
        assert results[phase]["errors"] == 0, phase
        for key in keys:
            value = results[phase][key]
            assert is_number(value), (phase, key, value)
            assert value > 0, (phase, key, value)
    for phase, keys in NUMBERS.items():
        for key in keys:
            assert is_number(results[phase][key]), (phase, key)
    assert results["sequential"]["requests"] > 0
    assert results["streaming"]["requests"] > 0

    runs = results["throughput"]["runs"]
    assert runs
    for run in runs:
        for side in ("direct", "gateway"):
            assert run[side]["errors"] == 0, (side, run)
            assert run[side]["requests"] > 0, (side, run)
            assert run[side]["rps"] > 0, (side, run)

    assert results["machine"]["nproc"] > 0
    assert results["machine"]["python"]
    assert len(results["commands"]) >= 3
    # Reported, never judged, in quick mode.
    assert [t["name"] for t in results["targets"]] == [
        "added_p50_ms",
        "gateway_rps",
        "added_first_p50_ms",
    ]
    assert all(t["pass"] is None for t in results["targets"])


@pytest.mark.e2e
def test_quick_wake_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "wake.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "wake.py"), "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "answered after the backend started listening" in done.stdout
    results = json.loads(out.read_text())
    assert results["rounds"] == 3
    for part in ("after_listen", "cold"):
        for key in ("p50_ms", "max_ms"):
            assert is_number(results[part][key]), (part, key)
    # The held request cannot be answered before the backend listens, nor the cold
    # request before the start-up delay has passed.
    assert results["after_listen"]["p50_ms"] > 0
    assert results["cold"]["p50_ms"] >= results["startup_delay_s"] * 1000
