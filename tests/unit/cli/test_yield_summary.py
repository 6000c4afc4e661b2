"""What `microscheduler yield` and `restore` print of the gateway's answer."""

from __future__ import annotations

from app.cli.gaming import restore_summary, yield_summary


def test_a_model_asleep_before_the_yield_is_said_to_be_already_asleep() -> None:
    # The README's `yield` more than idle_ttl_s after the first request: reasoning slept
    # already, so the yield freed nothing of it.
    body = {"reason": "gaming", "gpu": 0, "freed_mib": 0, "free_mib": 15393,
            "stopped": [], "slept": [], "already_asleep": ["reasoning"]}  # fmt: skip
    said = yield_summary(body)
    assert "freed 0 MiB" in said
    assert "stopped: -; slept: -" in said
    assert "already asleep: reasoning" in said.splitlines()


def test_nothing_is_said_of_sleepers_when_none_was_asleep_before() -> None:
    body = {"reason": "gaming", "gpu": 0, "freed_mib": 9625, "free_mib": 15393,
            "stopped": [], "slept": ["reasoning"], "already_asleep": []}  # fmt: skip
    assert "already asleep" not in yield_summary(body)


def test_a_restore_says_the_order_it_brings_the_models_back_in() -> None:
    body = {"restored": True, "order": ["chat", "coder"], "back": ["chat"],
            "starting": ["coder"], "on_demand": ["embed"], "failed": {}}  # fmt: skip
    assert restore_summary(body) == (
        "restored: back chat; starting coder; on demand embed; woken in this order: chat, coder"
    )
    body = {"restored": True, "order": [], "back": [], "starting": [], "on_demand": ["embed"]}
    assert "order" not in restore_summary(body)  # nothing woken: nothing to order
