"""The suite's one wait helper: it returns what it waited for and fails clearly."""

from __future__ import annotations

import itertools

import pytest

from tests.fakes.waits import until, until_sync


async def test_until_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert await until(lambda: next(counter) >= 3 and "done") == "done"


async def test_until_awaits_an_async_condition() -> None:
    seen: list[int] = []

    async def third() -> int | None:
        seen.append(len(seen))
        return len(seen) if len(seen) == 3 else None

    assert await until(third) == 3


async def test_until_fails_saying_what_how_long_and_what_it_saw() -> None:
    with pytest.raises(AssertionError) as info:
        await until(lambda: 0, timeout_s=0.05, what="the answer")
    assert str(info.value) == "still waiting after 0.05s for the answer (last seen: 0)"


def test_until_sync_shares_the_deadline_and_message() -> None:
    with pytest.raises(AssertionError) as info:
        until_sync(lambda: None, timeout_s=0.05, interval_s=0.01, what=lambda: "a zombie")
    assert str(info.value) == "still waiting after 0.05s for a zombie (last seen: None)"
    assert until_sync(lambda: [1], timeout_s=1) == [1]
