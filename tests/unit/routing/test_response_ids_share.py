"""The stored-response map gives each client key a share: one key creating responses in a
loop evicts only its own oldest ids, never another key's, under a global bound."""

from __future__ import annotations

from app.routing.registry import Route
from app.routing.responses import ResponseIds

ROUTE = Route(name="m", backend="b", upstream_model="m")


def test_one_key_filling_the_map_evicts_only_its_own_oldest_ids() -> None:
    ids = ResponseIds(max_ids=10, max_ids_per_key=3)
    ids.remember("resp_family", "b", ROUTE, "family")
    ids.remember("resp_anon", "b", ROUTE, None)
    for n in range(50):
        ids.remember(f"resp_flood{n}", "b", ROUTE, "flood")
    assert ids.lookup("resp_family") is not None
    assert ids.lookup("resp_anon") is not None
    assert ids.held_by("flood") == 3
    assert [ids.lookup(f"resp_flood{n}") is not None for n in (46, 47, 48, 49)] == [
        False, True, True, True,
    ]  # fmt: skip
    assert len(ids) == 5


def test_the_global_bound_still_holds_across_keys() -> None:
    ids = ResponseIds(max_ids=4, max_ids_per_key=3)
    for key in ("a", "b", "c"):
        for n in range(2):
            ids.remember(f"resp_{key}{n}", "b", ROUTE, key)
    assert len(ids) == 4
    assert ids.lookup("resp_a0") is None  # the oldest overall went first
    assert ids.lookup("resp_a1") is None
    assert ids.held_by("a") == 0
    assert ids.held_by("c") == 2


def test_forgetting_and_expiry_give_a_key_its_share_back() -> None:
    now = [0.0]
    ids = ResponseIds(ttl_s=10, max_ids=10, max_ids_per_key=2, clock=lambda: now[0])
    ids.remember("resp_1", "b", ROUTE, "k")
    ids.remember("resp_2", "b", ROUTE, "k")
    ids.forget("resp_1")
    assert ids.held_by("k") == 1
    ids.remember("resp_3", "b", ROUTE, "k")
    assert ids.lookup("resp_2") is not None  # the freed place was used, nothing evicted
    ids.remember("resp_2", "b", ROUTE, "k")  # the same id again: still one place
    assert ids.held_by("k") == 2
    now[0] = 10.0
    assert ids.lookup("resp_3") is None
    assert ids.held_by("k") == 0
    assert len(ids) == 0
