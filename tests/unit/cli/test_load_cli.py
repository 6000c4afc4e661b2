"""What `microscheduler load` and `unload` print of the gateway's answer: pure."""

from __future__ import annotations

from app.cli.backends import render_model


def test_a_load_prints_the_value_and_while_loading_how_far() -> None:
    loaded = {"success": True, "model": "qwen", "status": {"value": "loaded", "state": "ready"}}
    assert render_model(loaded) == "qwen: loaded"
    loading = {
        "model": "qwen",
        "status": {"value": "loading", "progress": {"phase": "loading_weights", "percent": 40}},
    }
    assert render_model(loading) == "qwen: loading (loading_weights, 40 %)"


def test_an_unload_prints_why_it_is_in_its_state() -> None:
    answer = {"model": "qwen", "status": {"value": "sleeping", "reason": "asleep: unload"}}
    assert render_model(answer) == "qwen: sleeping (asleep: unload)"
