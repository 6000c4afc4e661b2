"""Opt-in fallback triggers: a busy local backend (`local_queue_full`) moves a chain on only
when the chain's or the client key's `fallback_on` lists `queue_full`; every other reason
moves on as before. Unknown trigger names are refused by the configuration."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.routing.policy import FallbackReason, PolicyConfig
from app.settings.cloud import ChainConfig
from app.settings.keys import KeyConfig

R = FallbackReason


def test_a_full_queue_moves_on_only_when_the_chain_or_the_key_opts_in() -> None:
    assert not PolicyConfig().moves_on(R.LOCAL_QUEUE_FULL)
    assert PolicyConfig(fallback_on=frozenset({"queue_full"})).moves_on(R.LOCAL_QUEUE_FULL)
    assert PolicyConfig().moves_on(R.LOCAL_QUEUE_FULL, frozenset({"queue_full"}))


@pytest.mark.parametrize(
    "reason", [R.LOCAL_STOPPED, R.LOCAL_NO_VRAM, R.LOCAL_WAKE_TIMEOUT, R.HTTP_5XX, R.CONNECT]
)
def test_other_reasons_move_on_as_before(reason: FallbackReason) -> None:
    assert PolicyConfig().moves_on(reason)


def test_fallback_on_is_off_by_default_and_takes_only_known_triggers() -> None:
    assert ChainConfig(entries=["a"]).fallback_on == []
    assert ChainConfig(entries=["a"], fallback_on=["queue_full"]).fallback_on == ["queue_full"]
    with pytest.raises(ValidationError):
        ChainConfig(entries=["a"], fallback_on=["starting"])
    assert KeyConfig(key_env="K", fallback_on=["queue_full"]).fallback_on == ["queue_full"]
    with pytest.raises(ValidationError):
        KeyConfig(key_env="K", fallback_on=["everything"])
