"""The sleep guard's stop is a notification (`sleep_guard`), with its numbers: a wake that
fails no longer fails the backend (which was a `backend_failed` notification)."""

from __future__ import annotations

from app.notify.notifier import from_event, text_of
from app.settings.notify import NotifyTarget


def test_a_sleep_guard_event_is_a_sleep_guard_notification() -> None:
    event = {
        "seq": 7, "at": 1.5, "kind": "sleep_guard", "backend": "embed", "cause": "leak",
        "detail": "held asleep grew 600 MiB since its first sleep", "growth_mib": 600,
    }  # fmt: skip
    notification = from_event(event)
    assert notification is not None
    name, fields = notification
    assert name == "sleep_guard"
    assert fields == {
        "backend": "embed", "cause": "leak",
        "detail": "held asleep grew 600 MiB since its first sleep", "growth_mib": 600,
    }  # fmt: skip
    assert text_of(name, fields).startswith("sleep_guard: backend=embed, cause=leak, ")


def test_a_target_may_ask_for_it_and_gets_it_by_default() -> None:
    assert "sleep_guard" in NotifyTarget(url="https://hooks.example.org/gpu").events
    chosen = NotifyTarget(url="https://hooks.example.org/gpu", events=("sleep_guard",))
    assert chosen.events == ("sleep_guard",)
