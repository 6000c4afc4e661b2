"""The yield's holds as data: one per holder, each with its own expiry; the zone's
`holder` is the oldest's, its end the last hold's; saved and loaded with the state file,
a yield saved before holds loading as one hold."""

from __future__ import annotations

from app.vram.zones import Hold, Zone, holds_end


def yield_zone(*holds: Hold) -> Zone:
    zone = Zone("yield", "x", 0, 8000, 10.0, None, ("a",), kind="yield", slept=("b",))
    return zone.with_holds(holds)


def test_the_oldest_hold_names_the_yield_and_the_last_end_ends_it() -> None:
    zone = yield_zone(Hold("game", 20.0, 500.0), Hold("schedule evening", 10.0, 300.0))
    assert (zone.holder, zone.holders) == ("schedule evening", ("schedule evening", "game"))
    assert zone.expires_at == 500.0
    assert zone.hold_of("game") == Hold("game", 20.0, 500.0)
    assert zone.hold_of("nobody") is None
    # A hold that never ends by itself: nor does the yield.
    assert yield_zone(Hold("game", 20.0, 500.0), Hold("s", 10.0, None)).expires_at is None
    assert holds_end(()) is None
    assert Hold("game", 20.0, 500.0).expired(500.0) is True
    assert Hold("game", 20.0, None).expired(1e12) is False


def test_every_hold_round_trips_through_the_state_file() -> None:
    zone = yield_zone(Hold("schedule evening", 10.0, None), Hold("game", 20.0, 500.0))
    assert Zone.from_json(zone.to_json()) == zone


def test_a_yield_saved_before_holds_loads_as_one_hold() -> None:
    old = {
        "name": "yield", "holder": "elden-ring", "gpu": 0, "mib": 8000, "granted_at": 10.0,
        "expires_at": 99.0, "stopped": ["a"], "kind": "yield", "slept": [], "report": None,
        "host": "local",
    }  # fmt: skip
    zone = Zone.from_json(old)
    assert zone.holds == (Hold("elden-ring", 10.0, 99.0),)
    assert (zone.holder, zone.expires_at) == ("elden-ring", 99.0)


def test_a_plain_zone_has_no_holds() -> None:
    zone = Zone("img", "comfy", 0, 4000, 10.0, None, ("a",))
    assert "holds" not in zone.to_json()  # its saved entry is as before
    assert Zone.from_json(zone.to_json()) == zone
