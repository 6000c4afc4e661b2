"""`microscheduler ps` says what an idle backend's countdown ends in, as the control page
does: a backend that will sleep is not said to stop."""

from __future__ import annotations

from app.cli.backends import render_ps


def backend(name: str, action: str | None, left: float | None) -> dict[str, object]:
    return {
        "name": name, "state": "ready", "lifecycle": "lazy", "held_mib": 6000,
        "in_flight": 0, "waiting": 0, "idle_stop_in_s": left,
        "idle": None if action is None else {"method": "auto", "level": 2, "action": action},
    }  # fmt: skip


def test_the_idle_column_names_the_action() -> None:
    lines = render_ps(
        [
            backend("sleeper", "sleep", 598.2),
            backend("stopper", "stop", 42),
            backend("busy", "sleep", None),
        ]
    ).splitlines()
    assert lines[0].split()[-2:] == ["when", "idle"]
    assert lines[1].endswith("sleep in 9m 58s")
    assert lines[2].endswith("stop in 42s")
    assert lines[3].endswith("-")
