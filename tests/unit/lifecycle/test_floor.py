"""A residency floor (a client's `keep_alive`): set, extended, never shortened, ended."""

from __future__ import annotations

import math

from app.lifecycle.floor import ResidencyFloor


def test_a_floor_lasts_its_seconds_and_is_never_shortened() -> None:
    floor = ResidencyFloor()
    assert floor.left_s(100.0) == 0.0
    floor.keep(600.0, now=100.0)
    assert floor.left_s(400.0) == 300.0
    floor.keep(60.0, now=400.0)  # a shorter ask later: the longer floor stays
    assert floor.left_s(400.0) == 300.0
    assert floor.left_s(800.0) == 0.0
    floor.keep(math.inf, now=800.0)  # until unloaded
    assert math.isinf(floor.left_s(10**9))
    floor.clear()
    assert floor.left_s(800.0) == 0.0
