"""Where a `gpus: auto` start goes (app.vram.choose): pure, no loop."""

from __future__ import annotations

from app.vram.choose import candidate_sets, choose
from app.vram.placement import Resident

GIB = 1024
TOTAL = 24 * GIB


def resident(name: str, gpus: tuple[int, ...], mib: int, **fields: object) -> Resident:
    return Resident(name=name, gpus=gpus, vram_mib=mib, priority=50, lazy=True, **fields)  # type: ignore[arg-type]


def free(*used: int) -> dict[int, int]:
    return {gpu: TOTAL - mib for gpu, mib in enumerate(used)}


def test_the_candidates_are_every_set_of_its_size_or_its_placements() -> None:
    assert candidate_sets(1, [1, 0]) == [(0,), (1,)]
    assert candidate_sets(2, [0, 1, 2]) == [(0, 1), (0, 2), (1, 2)]
    assert candidate_sets(3, [0, 1]) == []
    # Docker: only the sets its containers were created on, and only GPUs the probe sees.
    assert candidate_sets(1, [0, 1], [(1,), (2,)]) == [(1,)]


def test_pack_fills_the_fuller_gpu_that_still_fits_and_spread_the_emptier() -> None:
    room = free(14 * GIB, 0)
    packed = choose([(0,), (1,)], 4 * GIB, room, [], policy="pack", below_priority=50,
                    equal_priority=50)  # fmt: skip
    spread = choose([(0,), (1,)], 4 * GIB, room, [], policy="spread", below_priority=50,
                    equal_priority=50)  # fmt: skip
    assert packed is not None
    assert packed.gpus == (0,)
    assert packed.why == "GPU 0: 10.0 GiB free, pack"
    assert spread is not None
    assert spread.gpus == (1,)
    assert spread.why == "GPU 1: 24.0 GiB free, spread"


def test_a_start_that_fits_on_an_empty_gpu_evicts_nobody() -> None:
    a = resident("a", (0,), 14 * GIB)
    choice = choose([(0,), (1,)], 14 * GIB, free(14 * GIB, 0), [a], policy="pack",
                    below_priority=50, equal_priority=50)  # fmt: skip
    assert choice is not None
    assert (choice.gpus, choice.plan.evict) == ((1,), ())


def test_with_no_room_anywhere_it_evicts_where_eviction_frees_most() -> None:
    # GPU 0: a (idle longest) and a pinned 2 GiB; GPU 1: b, used more recently. The least
    # recently used is a, but evicting it leaves 8 GiB on GPU 0; evicting b leaves 10.
    a = resident("a", (0,), 14 * GIB, idle_s=60.0)
    pinned = Resident(name="p", gpus=(0,), vram_mib=2 * GIB, priority=90, lazy=False)
    b = resident("b", (1,), 14 * GIB, idle_s=5.0)
    choice = choose([(0,), (1,)], 14 * GIB, free(16 * GIB, 14 * GIB), [a, pinned, b],
                    policy="pack", below_priority=50, equal_priority=50)  # fmt: skip
    assert choice is not None
    assert (choice.gpus, choice.plan.evict) == ((1,), ("b",))
    assert choice.why == "GPU 1: room made by evicting b (10.0 GiB free after), pack"


def test_an_idle_victim_goes_before_a_busy_one_that_would_free_more() -> None:
    a = resident("a", (0,), 14 * GIB, in_flight=2)
    pinned = Resident(name="p", gpus=(1,), vram_mib=2 * GIB, priority=90, lazy=False)
    b = resident("b", (1,), 14 * GIB)
    # Evicting the busy a would leave 12 GiB free on GPU 0, the idle b 10 on GPU 1.
    choice = choose([(0,), (1,)], 12 * GIB, free(14 * GIB, 16 * GIB), [a, pinned, b],
                    policy="pack", below_priority=50, equal_priority=50)  # fmt: skip
    assert choice is not None
    assert (choice.gpus, choice.plan.evict) == ((1,), ("b",))


def test_tensor_parallel_needs_room_on_every_gpu_of_its_set() -> None:
    a = resident("a", (1,), 14 * GIB)
    choice = choose([(0, 1)], 12 * GIB, free(0, 14 * GIB), [a], policy="pack",
                    below_priority=50, equal_priority=50)  # fmt: skip
    assert choice is not None
    assert (choice.gpus, choice.plan.evict) == ((0, 1), ("a",))


def test_a_higher_priority_holder_is_never_evicted_and_the_refusal_names_the_set() -> None:
    a = resident("a", (0,), 20 * GIB)
    high = Resident(name="h", gpus=(1,), vram_mib=20 * GIB, priority=90, lazy=True)
    choice = choose([(0,), (1,)], 14 * GIB, free(20 * GIB, 20 * GIB), [a, high],
                    policy="pack", below_priority=50, equal_priority=50)  # fmt: skip
    assert choice is not None
    assert (choice.gpus, choice.plan.evict) == ((0,), ("a",))
    nothing = choose([(1,)], 14 * GIB, free(20 * GIB, 20 * GIB), [a, high], policy="pack",
                     below_priority=50, equal_priority=50)  # fmt: skip
    assert nothing is not None
    assert not nothing.plan.fits
    assert nothing.why == "GPU 1: does not fit"
    assert choose([], GIB, free(0), [], policy="pack", below_priority=50, equal_priority=50) is None


def test_a_protected_holder_is_waited_for_on_the_set_whose_wait_is_shortest() -> None:
    a = resident("a", (0,), 20 * GIB, protected_s=30.0)
    b = resident("b", (1,), 20 * GIB, protected_s=5.0)
    choice = choose([(0,), (1,)], 14 * GIB, free(20 * GIB, 20 * GIB), [a, b], policy="pack",
                    below_priority=50, equal_priority=50)  # fmt: skip
    assert choice is not None
    assert choice.gpus == (1,)
    assert choice.plan.wait_s == 5.0
