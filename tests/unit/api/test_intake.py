"""The loop's intake of new requests: at most `per_turn` a turn, the rest held and taken
in first come first served on the next turns; the count halves after a slow turn and
grows after quick ones. A fake loop whose turns the test runs by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.api.intake import MAX_PER_TURN, MIN_PER_TURN, PER_TURN, SLOW_TURN_S, Intake


class Loop:
    """Callbacks run when the test says a turn passes; its clock moves when told."""

    def __init__(self) -> None:
        self.now = 0.0
        self.soon: list[tuple[Callable[..., object], tuple[Any, ...]]] = []

    def call_soon(self, callback: Callable[..., object], *args: Any) -> object:
        self.soon.append((callback, args))
        return callback

    def time(self) -> float:
        return self.now

    def turn(self, lasting_s: float = 0.0) -> None:
        """The loop's next turn: what was scheduled runs, then `lasting_s` passes."""
        due, self.soon = self.soon, []
        for callback, args in due:
            callback(*args)
        self.now += lasting_s


class Connection:
    def __init__(self, name: int, log: list[int]) -> None:
        self.name, self.log = name, log

    def take_in(self) -> None:
        self.log.append(self.name)


def arrive(intake: Intake, loop: Loop, count: int, log: list[int]) -> list[int]:
    """`count` new requests in one turn; the names of those taken in at once."""
    now = []
    for name in range(count):
        if intake.admit(Connection(name, log), loop):
            now.append(name)
    return now


def test_a_burst_is_taken_in_a_turn_at_a_time_first_come_first_served() -> None:
    loop, intake = Loop(), Intake()
    later: list[int] = []
    now = arrive(intake, loop, 4 * PER_TURN + 5, later)
    assert now == list(range(PER_TURN))  # the rest wait, their bytes held
    assert len(intake.waiting) == 3 * PER_TURN + 5
    loop.turn()
    assert later == list(range(PER_TURN, 2 * PER_TURN))
    loop.turn()  # after a quick turn the count grows
    assert later == list(range(PER_TURN, 3 * PER_TURN + MIN_PER_TURN))
    while intake.waiting:
        loop.turn()
    assert later == list(range(PER_TURN, 4 * PER_TURN + 5))  # every one, in order


def test_a_request_after_the_waiting_ones_waits_behind_them() -> None:
    loop, intake = Loop(), Intake(per_turn=2)
    later: list[int] = []
    assert arrive(intake, loop, 3, later) == [0, 1]
    assert not intake.admit(Connection(99, later), loop)  # a newcomer, room or not
    loop.turn()
    assert later == [2, 99]


def test_a_closed_waiting_connection_is_forgotten() -> None:
    loop, intake = Loop(), Intake(per_turn=1)
    later: list[int] = []
    first, gone = Connection(1, later), Connection(2, later)
    assert intake.admit(first, loop)
    assert not intake.admit(gone, loop)
    intake.forget(gone)
    loop.turn()
    assert later == []
    assert intake.waiting == {}


def test_slow_turns_halve_the_count_and_quick_ones_grow_it_back() -> None:
    loop, intake = Loop(), Intake()
    later: list[int] = []
    arrive(intake, loop, 10 * PER_TURN, later)
    loop.turn(lasting_s=SLOW_TURN_S * 2)  # the requests taken in made it slow
    loop.turn(lasting_s=SLOW_TURN_S * 2)
    assert intake.per_turn == PER_TURN // 2
    for _ in range(5):
        loop.turn(lasting_s=SLOW_TURN_S * 2)
    assert intake.per_turn == MIN_PER_TURN  # never below
    loop.turn(lasting_s=0.001)
    loop.turn(lasting_s=0.001)
    assert intake.per_turn == 2 * MIN_PER_TURN
    assert MAX_PER_TURN >= PER_TURN


def test_quiet_traffic_is_never_held() -> None:
    loop, intake = Loop(), Intake()
    later: list[int] = []
    for _ in range(20):  # a few requests a turn, turns apart
        assert arrive(intake, loop, 3, later) == [0, 1, 2]
        loop.turn(lasting_s=1.0)
        loop.turn(lasting_s=1.0)
    assert later == []
    assert intake.per_turn == PER_TURN  # idle turns do not count as slow ones
