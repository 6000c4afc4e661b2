"""A model's `status` (llama.cpp's router shape) from its backend's state: pure."""

from __future__ import annotations

from app.api.model_cards import VALUES, group_status, status_of
from app.lifecycle.load import LoadStatus
from app.lifecycle.state import BackendState


def test_every_state_has_one_of_the_five_values() -> None:
    assert set(VALUES) == set(BackendState)
    assert set(VALUES.values()) == {"loaded", "loading", "sleeping", "unloaded", "failed"}


def test_a_failure_says_failed_as_llama_cpp_does_and_why() -> None:
    status = status_of(BackendState.FAILED, "exited with code 1", None, ())
    assert status == {
        "value": "failed",
        "state": "failed",
        "failed": True,
        "reason": "exited with code 1",
    }


def test_a_load_under_way_has_its_progress_and_a_blocked_model_what_blocks_it() -> None:
    load = LoadStatus("loading_weights", 40, 12)
    loading = status_of(BackendState.STARTING, None, load, ())
    assert loading["progress"] == {
        "stages": ["model"],
        "current": "model",
        "value": 0.4,
        "phase": "loading_weights",
        "percent": 40,
        "eta_s": 12,
    }
    # Progress only while starting (a stop keeps no stale one).
    assert "progress" not in status_of(BackendState.STOPPING, None, load, ())
    blocked = status_of(BackendState.STOPPED, "zone", None, ["zone img (comfyui)"])
    assert blocked["value"] == "unloaded"
    assert blocked["blocked_by"] == ["zone img (comfyui)"]


def test_a_group_is_its_best_member_with_each_members_value() -> None:
    failed = status_of(BackendState.FAILED, "crashed", None, ())
    asleep = status_of(BackendState.SLEEPING, None, None, ())
    group = group_status({"a": failed, "b": asleep})
    assert group["value"] == "sleeping"
    assert group["replicas"] == {"a": "failed", "b": "sleeping"}
    assert group_status({"a": failed})["value"] == "failed"
