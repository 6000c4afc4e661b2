"""`bench/switch.py --quick` runs end to end: two lazy fakes that do not fit together take
turns through a gateway process, with stop and with sleep eviction, then with and without
collation. Timing targets are never asserted (the quick counts are too small and CI
machines are noisy); the shape of the results and their invariants are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_quick_switch_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "switch.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "switch.py"), "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
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
    for phase in (held, thrash):
        assert phase["errors"] == 0, phase["error_kinds"]
        assert phase["requests"] == 16
        assert phase["max_wait_s"] <= phase["bound_s"]
    assert [t["name"] for t in results["targets"]] == [
        "gateway's share of a sleep switch, p95 <= 50 ms",
        "collation: fewer switches than max_hold_s 0",
        "no request waits past max_wait_s, none refused",
    ]
