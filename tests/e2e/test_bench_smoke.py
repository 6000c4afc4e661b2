"""Each benchmark's `--quick` run end to end (`bench/overhead.py`, `wake.py`, `soak.py`,
`keys.py`, `switch.py`, `chatty.py`, `looplag.py`): its servers start, every response is
valid, its JSON has the shape and the invariants it promises.

Timing targets are never asserted here; the quick counts are far too small to mean anything,
and CI machines are noisy. Without wrk the quick mode falls back to a Python load loop.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

POSITIVE = {
    "sequential": [
        "direct_p50_ms",
        "gateway_p50_ms",
        "direct_p99_ms",
        "gateway_p99_ms",
        "bare_p50_ms",
        "bare_p99_ms",
    ],
    "throughput": [
        "direct_rps",
        "gateway_rps",
        "ratio",
        "bare_rps",
        "bare_cpu_us_per_req",
        "gateway_cpu_us_per_req",
        "cpu_vs_bare",
    ],
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
    "sequential": ["added_p50_ms", "added_p99_ms", "bare_added_p50_ms"],
    "streaming": ["added_first_p50_ms", "added_end_p50_ms"],
    "keys": ["added_p50_ms", "added_stream_end_p50_ms"],
}


def run_quick(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`bench/<script> --quick ARGS`, which must exit 0 (its output shown when it does not)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@pytest.mark.e2e
def test_quick_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_quick("overhead.py", "--json", str(out), timeout=90)
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
        for side in ("direct", "bare", "gateway"):
            assert run[side]["errors"] == 0, (side, run)
            assert run[side]["requests"] > 0, (side, run)
            assert run[side]["rps"] > 0, (side, run)

    assert results["machine"]["nproc"] > 0
    assert results["machine"]["python"]
    assert len(results["commands"]) >= 4
    assert any("bench.bare_relay" in command for command in results["commands"])
    # Reported, never judged, in quick mode: CPU per request against the bare relay beside
    # it (issue 35), not a req/s figure of the machine.
    assert [t["name"] for t in results["targets"]] == [
        "added_p50_ms",
        "cpu_vs_bare",
        "added_first_p50_ms",
    ]
    assert all(t["pass"] is None for t in results["targets"])


@pytest.mark.e2e
def test_quick_wake_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "wake.json"
    done = run_quick("wake.py", "--json", str(out), timeout=90)
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
    done = run_quick("soak.py", "--json", str(out), timeout=120)
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
    done = run_quick("keys.py", timeout=60)
    rows = [
        line for line in done.stdout.splitlines() if line.startswith("| ") and "us |" not in line
    ]
    assert [row.split(" | ")[0] for row in rows] == [
        "| no keys (anonymous)",
        "| keys.yaml, 3 keys, every limit on",
    ]
    for row in rows:
        assert float(row.split(" | ")[1].rstrip(" |")) > 0


@pytest.mark.e2e
def test_quick_switch_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "switch.json"
    done = run_quick("switch.py", "--json", str(out), timeout=240)
    assert "| Eviction | switches |" in done.stdout
    results = json.loads(out.read_text())
    stop, sleep = results["switch_phases"]
    assert (stop["method"], sleep["method"]) == ("stop", "sleep")
    for phase in (stop, sleep):
        assert phase["switches"] == 4
        assert phase["gateway_swaps"] >= 5  # every switch evicted the other model
        for key in ("ttfb", "modelled", "gateway"):
            assert phase[key]["p50_ms"] > 0 or key == "gateway", (phase["method"], key)
        # The first byte cannot come before the fake's own modelled wait.
        assert phase["ttfb"]["p50_ms"] >= phase["modelled"]["p50_ms"]
    assert stop["cold_starts"] == 4  # stopped: every switch a cold start
    assert sleep["cold_starts"] == 0  # asleep: every switch a wake of the same process
    setup = results["setup"]
    assert stop["modelled"]["p50_ms"] == pytest.approx(setup["startup_delay_s"] * 1000)
    held, thrash = results["collation"]
    assert held["max_hold_s"] > 0
    assert thrash["max_hold_s"] == 0
    cancelled = results["cancelled"]  # its only client left: the start was cancelled
    assert cancelled["fake_stopped"] is True
    assert 0 < cancelled["ran_s"] < cancelled["modelled_load_s"]
    assert cancelled["not_spent_s"] > 0
    for phase in (held, thrash):
        assert phase["errors"] == 0, phase["error_kinds"]
        assert phase["requests"] == 16
        assert phase["max_wait_s"] <= phase["bound_s"]
    fair = results["fairness"]
    assert (fair["flood"], fair["later"], fair["requests"], fair["errors"]) == (100, 5, 105, 0)
    # b's requests take turns with a's flood: each within a few slots (measured 11; the
    # target's 12 is not enforced: a loaded machine's thread starts add slots), not behind
    # a's queue (arrival order: 80 or more)
    assert 0 <= fair["worst_position"] <= 30 < fair["queued_ahead"]
    assert "| key a floods, key b after | 100 |" in done.stdout
    assert [t["name"] for t in results["targets"]] == [
        "gateway's share of a sleep switch, p95 <= 50 ms",
        "collation: fewer switches than max_hold_s 0",
        "no request waits past max_wait_s, none refused",
        "a start nobody waits for is cancelled, its server stopped",
        "fair turns: each of b's requests within 12 slots of its arrival",
    ]


@pytest.mark.e2e
def test_quick_chatty_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "chatty.json"
    done = run_quick("chatty.py", "--json", str(out), timeout=120)
    assert "SIGTERM to exit" in done.stdout
    results = json.loads(out.read_text())
    assert results["written_mb"] > 0
    for part in ("baseline", "health"):
        for key in ("p50_ms", "p99_ms", "max_ms"):
            assert is_number(results[part][key]), (part, key)
    assert results["health"]["n"] > 0
    assert results["rss_mb"]["peak"] > 0
    # What is not timing: the cap holds, and the gateway exits at SIGTERM.
    files = results["files"]
    assert max(files["log_max_bytes"], files["log1_max_bytes"]) <= files["cap_bytes"]
    assert results["sigterm_exit_s"] is not None


@pytest.mark.e2e
def test_quick_looplag_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "looplag.json"
    done = run_quick("looplag.py", "--json", str(out), timeout=180)
    assert "| phase | samples | p50 | p99 | max |" in done.stdout
    results = json.loads(out.read_text())
    assert results["rounds"]["starts_and_wakes"] == 4  # 2 rounds: a start and a wake each
    assert results["load_alone"]["starts_and_wakes"] == 0
    assert "Held: the lag less the loop's thread's wait for a CPU" in done.stdout
    for phase in ("rest", "rounds", "load_alone"):
        for series in ("lag", "held"):  # the held one: this kernel has schedstat
            part = results[phase][series]
            assert part["samples"] > 0, phase  # the gateway's histogram moved
            assert is_number(part["p99_ms"]), phase
            assert part["max_bucket_ms"] >= part["p99_ms"] or part["p99_ms"] == 0, phase
            assert part["max_ms"] is None  # a 2 s rest: the max is known to its bucket only
        # Held is the lag less a wait: never in a higher bucket than the lag's largest.
        assert results[phase]["held"]["max_bucket_ms"] <= results[phase]["lag"]["max_bucket_ms"]
    assert results["rounds"]["load_requests"] > 0


@pytest.mark.e2e
def test_the_state_save_benchmark_prints_the_loops_share() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "stateput.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = re.fullmatch(
        r"loop held per put: median ([\d.]+) ms, max ([\d.]+) ms \(50 puts, 8 sections\)\n",
        done.stdout,
    )
    assert found is not None, done.stdout
    assert 0 < float(found.group(1)) <= float(found.group(2))
