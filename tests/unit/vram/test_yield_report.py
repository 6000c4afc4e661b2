"""A yield's report as saved in the state file: what it lists survives a restart."""

from __future__ import annotations

from app.vram.zones import YieldReport


def report(**fields: object) -> YieldReport:
    base: dict[str, object] = {
        "reason": "gaming", "gpu": 0, "min_free_mib": None, "include_pinned": False,
        "freed_mib": 0, "free_mib": 15393, "free_mib_before": 15393, "met": None,
        "measured_by": "sim", "stopped": (), "slept": (), "blocked": (), "failed": {},
        "drain_timeouts": (), "duration_s": 0.01,
    }  # fmt: skip
    return YieldReport(**{**base, **fields})  # type: ignore[arg-type]


def test_already_asleep_is_saved_and_read_back_after_slept() -> None:
    taken = report(slept=("embed",), already_asleep=("reasoning",))
    saved = taken.to_json()
    assert list(saved)[list(saved).index("slept") + 1] == "already_asleep"
    assert saved["already_asleep"] == ["reasoning"]
    assert YieldReport.from_json(saved) == taken


def test_a_report_saved_before_already_asleep_existed_reads_as_none_asleep() -> None:
    saved = report(slept=("embed",)).to_json()
    del saved["already_asleep"]
    assert YieldReport.from_json(saved).already_asleep == ()
