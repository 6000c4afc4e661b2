"""Ollama's wire conventions: `keep_alive` read as Ollama's Go server reads it, model names
with and without `:latest`, timestamps as Go writes them."""

from __future__ import annotations

import math
from datetime import datetime

import pytest

from app.errors import InvalidRequest
from app.ollama.wire import FOREVER, go_duration_s, keep_alive_s, tagged, timestamp, untagged


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),  # absent: the server's default
        (0, 0.0),
        ("0", 0.0),
        (30, 30.0),  # a number is seconds (api/types.go Duration.UnmarshalJSON)
        (1.5, 1.5),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        (-1, FOREVER),  # negative: forever
        ("-1m", FOREVER),
    ],
)
def test_keep_alive_as_ollama_reads_it(value: object, seconds: float | None) -> None:
    assert keep_alive_s(value) == seconds


@pytest.mark.parametrize("value", ["5 minutes", "m", "", True, [1]])
def test_an_unreadable_keep_alive_is_a_400(value: object) -> None:
    with pytest.raises(InvalidRequest):
        keep_alive_s(value)


def test_go_durations() -> None:
    assert go_duration_s("2h45m30.5s") == 9930.5
    assert go_duration_s("1.5h") == 5400.0
    assert go_duration_s("10") is None  # Go needs a unit but for "0"
    assert math.isclose(go_duration_s("-300us") or 0.0, -0.0003)


def test_names_gain_and_lose_latest() -> None:
    assert tagged("qwen3") == "qwen3:latest"
    assert tagged("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B:latest"
    assert tagged("llama3:8b") == "llama3:8b"
    known = {"qwen3", "odd:latest"}.__contains__
    assert untagged("qwen3:latest", known) == "qwen3"  # Open WebUI's eject adds the tag
    assert untagged("odd:latest", known) == "odd:latest"  # a served id with the tag kept
    assert untagged("nowhere:latest", known) == "nowhere:latest"  # unknown: as given (404)


def test_timestamps_as_go_writes_them() -> None:
    text = timestamp(1700000000.25)
    assert text == "2023-11-14T22:13:20.250000Z"
    assert datetime.fromisoformat(text).timestamp() == 1700000000.25  # Open WebUI parses it
