"""Waits priced in (`app.routing.patience`) and the learned wake durations they read."""

from __future__ import annotations

import pytest

from app.errors import InvalidRequest
from app.lifecycle.load import StartDurations, load_status
from app.routing.patience import accepted_wait, expected_wake_header, parse_max_wait, priced_out
from app.upstreams.vllm_output import LoadProgress


@pytest.mark.parametrize(("text", "seconds"), [("5", 5.0), (" 2.5 ", 2.5), ("0", 0.0),
                                               ("3600", 3600.0)])  # fmt: skip
def test_the_header_takes_plain_seconds(text: str, seconds: float) -> None:
    assert parse_max_wait(text) == seconds
    assert parse_max_wait(None) is None


@pytest.mark.parametrize("text", ["-1", "3600.5", "1e2", "inf", "nan", "", "5s", "0x10"])
def test_anything_else_is_refused_naming_the_header(text: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_max_wait(text)
    assert caught.value.param == "x-microscheduler-max-wait"


def test_the_header_wins_over_the_key_which_wins_over_the_chain() -> None:
    assert accepted_wait(1.0, 2.0, 3.0) == 1.0
    assert accepted_wait(None, 2.0, 3.0) == 2.0
    assert accepted_wait(None, None, 3.0) == 3.0
    assert accepted_wait(None, None, None) is None
    assert accepted_wait(0.0, 2.0, None) == 0.0  # zero is a wait said, not nothing


def test_only_a_known_wait_longer_than_accepted_is_priced_out() -> None:
    assert priced_out(30.0, 5.0)
    assert not priced_out(5.0, 5.0)
    assert not priced_out(None, 5.0)  # never measured: wait as before
    assert not priced_out(30.0, None)  # the caller said nothing
    assert not priced_out(0.0, 0.0)  # ready
    assert expected_wake_header([("a", 42.04), ("b", 3.0)]) == b"a=42.0s; b=3.0s"


def test_wakes_are_learned_per_sleep_level_apart_from_cold_starts() -> None:
    durations = StartDurations(None)
    durations.record("m", 40.0, cold=True)
    durations.record("m", 2.0, cold=False, wake_level=1)
    durations.record("m", 12.0, cold=False, wake_level=0)  # level unknown: reloads weights
    durations.record("m", 99.0, cold=False)  # an adoption: not measured
    assert durations.get("m") == 40.0
    assert durations.get_wake("m", 1) == 2.0
    assert durations.get_wake("m", 2) == 12.0
    assert durations.get_wake("m", None) == 12.0
    assert durations.get_wake("other", 1) is None


class _Watch:
    load: LoadProgress | None = None
    vram_wait_phase: str | None = None


def test_a_wake_in_progress_has_an_eta_from_the_last_wake() -> None:
    assert load_status(1.0, 3.0, _Watch(), waking=True).eta_s == 2
    assert load_status(1.0, None, _Watch(), waking=True).eta_s is None
