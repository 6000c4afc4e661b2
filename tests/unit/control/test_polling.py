"""`app.control.polling`: how often an idle backend's server is polled (pure)."""

from __future__ import annotations

import pytest

from app.control.polling import IDLE_MAX_S, poll_due, poll_interval_s


@pytest.mark.parametrize(
    ("idle_s", "interval_s"),
    [
        (0.0, 5.0),  # requests in flight
        (10.0, 5.0),  # a pause between requests: the configured rate
        (20.0, 5.0),
        (40.0, 10.0),
        (60.0, 15.0),
        (120.0, 30.0),
        (3600.0, IDLE_MAX_S),  # bounded
    ],
)
def test_the_health_interval_grows_with_the_idle_time(idle_s: float, interval_s: float) -> None:
    assert poll_interval_s(5.0, idle_s) == interval_s


def test_a_failing_server_is_polled_at_the_configured_rate_however_idle() -> None:
    assert poll_interval_s(5.0, 3600.0, failing=True) == 5.0


def test_the_scrape_rate_grows_the_same_way() -> None:
    assert [poll_interval_s(1.0, idle) for idle in (0.0, 4.0, 10.0, 60.0, 600.0)] == [
        1.0, 1.0, 2.5, 15.0, 30.0,
    ]  # fmt: skip


def test_a_configured_interval_longer_than_the_bound_is_kept() -> None:
    assert poll_interval_s(60.0, 3600.0) == 60.0


def test_at_72_polls_a_minute_idle_becomes_4() -> None:
    # The default 5 s health watch and 1 s scrape of a backend idle for minutes.
    per_minute = 60 / poll_interval_s(5.0, 600.0) + 60 / poll_interval_s(1.0, 600.0)
    assert (60 / 5.0 + 60 / 1.0, per_minute) == (72, 4)


@pytest.mark.parametrize(
    ("since_s", "interval_s", "due"),
    [
        (None, 30.0, True),  # never polled
        (5.02, 5.0, True),  # every round while in use
        (4.9, 5.0, True),  # a round that came a little early still polls
        (10.0, 15.0, False),
        (12.6, 15.0, True),  # within half a round of the interval
        (29.0, 30.0, True),
        (25.0, 30.0, False),
    ],
)
def test_a_round_polls_once_the_interval_has_passed(
    since_s: float | None, interval_s: float, due: bool
) -> None:
    assert poll_due(since_s, interval_s, 5.0) is due
