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
    "keys": [
        "plain_p50_ms",
        "keyed_p50_ms",
        "plain_stream_end_p50_ms",
        "keyed_stream_end_p50_ms",
        "plain_rps",
        "keyed_rps",
        "ratio",
    ],
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
    "keys": ["added_p50_ms", "added_stream_end_p50_ms"],
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


@pytest.mark.e2e
def test_quick_soak_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "| Measurement |" in done.stdout
    results = json.loads(out.read_text())
    assert results["quick"] is True
    assert results["errors"] == 0
    streams, short = results["streams"], results["short"]
    assert streams["warmup"]["errors"] == 0
    assert results["repeat"]["errors"] == 0
    assert results["repeat"]["gateway_peak"]["peak_rss_mb"] > 0
    for phase in (streams, short):
        assert phase["errors"] == 0
        for side in ("direct", "gateway"):
            assert phase[side]["errors"] == 0, (side, phase[side]["error_kinds"])
            assert phase[side]["requests"] > 0
            for key in ("wall_s", "rps", "p50_s", "max_s"):
                assert is_number(phase[side][key]), (side, key)
                assert phase[side][key] > 0, (side, key)
    assert streams["direct"]["requests"] == streams["streams"] == 50
    assert short["gateway"]["requests"] == short["requests"] == 500
    for key in ("gateway_start", "gateway_after", "gateway_later"):
        assert streams[key]["rss_mb"] > 0, key
        assert streams[key]["fds"] > 0, key
    assert streams["gateway_peak"]["samples"] > 0
    assert streams["gateway_peak"]["peak_rss_mb"] >= streams["gateway_start"]["rss_mb"] / 2
    # Every stream is a client socket in the gateway at the peak (and an upstream one).
    assert streams["gateway_peak"]["peak_fds"] >= streams["streams"]
    for key in ("wall_ratio", "rss_after_vs_start"):
        assert is_number(streams[key]), key
    assert results["nofile"]["soft"] >= results["nofile"]["needed"]
    assert len(results["commands"]) == 3
    idle = results["idle"]
    assert idle["opened"] + idle["refused"] == idle["attempted"] == 300
    assert idle["normal_requests"] > 0  # the gateway answered others during the flood
    attacks = results["attacks"]
    assert attacks["errors"] == 0
    (dribble,) = attacks["dribble"]
    assert dribble["dribblers"] == 1100
    assert dribble["served"] == dribble["total"] == 20  # beside 1,100 dribbled heads
    assert dribble["before"]["rss_mb"] > 0
    assert dribble["after"]["rss_mb"] > 0
    assert attacks["trailers"]["status"] == 431
    assert attacks["trailers"]["after"]["rss_mb"] > 0
    assert "runtime: {kind: external}" in results["models_yaml"]
    assert "max_connections" not in results["models_yaml"]  # the default pool: uncapped
    # Reported, never judged, in quick mode.
    assert [t["name"] for t in results["targets"]] == [
        "errors",
        "stream_wall_ratio",
        "stream_peak_rss_mb",
        "rss_after_vs_start",
    ]
    assert all(t["pass"] is None for t in results["targets"])


@pytest.mark.e2e
def test_quick_keys_benchmark_prints_the_cost_of_a_key() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "keys.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    rows = [
        line for line in done.stdout.splitlines() if line.startswith("| ") and "us |" not in line
    ]
    assert [row.split(" | ")[0] for row in rows] == [
        "| no keys (anonymous)",
        "| keys.yaml, 3 keys, every limit on",
    ]
    for row in rows:
        assert float(row.split(" | ")[1].rstrip(" |")) > 0
