"""A blocked backend's refusal: the telling kind, every hold of it, and `Retry-After`."""

from __future__ import annotations

from app.lifecycle.blocks import RETRY_AFTER_S, BlockKind, Blocks

NOW = 1_800_000_000.0


def retry_after(blocks: Blocks) -> str:
    refusal = blocks.refusal("reasoning", NOW)
    assert refusal is not None
    return refusal.headers["retry-after"]


def test_nothing_blocks_nothing_is_refused() -> None:
    assert Blocks().refusal("reasoning", NOW) is None


def test_a_hold_with_a_ttl_says_when_it_ends() -> None:
    blocks = Blocks()
    blocks.add("zone:yield", "the VRAM yield for 'gaming'", BlockKind.YIELDED, NOW + 90.2)
    refusal = blocks.refusal("reasoning", NOW)
    assert refusal is not None
    assert (refusal.code, refusal.headers) == ("backend_yielded", {"retry-after": "91"})


def test_a_hold_until_released_asks_for_a_few_seconds() -> None:
    blocks = Blocks()
    blocks.add("profile", "GPU profile 'gaming'", BlockKind.DISABLED)
    assert retry_after(blocks) == str(RETRY_AFTER_S)


def test_the_last_hold_of_the_telling_kind_decides() -> None:
    blocks = Blocks()
    blocks.add("zone:a", "zone a", BlockKind.BLOCKED, NOW + 30)
    blocks.add("zone:b", "zone b", BlockKind.BLOCKED, NOW + 300)
    assert retry_after(blocks) == "300"
    blocks.add("zone:c", "zone c", BlockKind.BLOCKED)  # until released
    assert retry_after(blocks) == str(RETRY_AFTER_S)
    blocks.add("zone:yield", "the yield", BlockKind.YIELDED, NOW + 5)  # more telling
    refusal = blocks.refusal("reasoning", NOW)
    assert refusal is not None
    assert (refusal.code, refusal.headers["retry-after"]) == ("backend_yielded", "5")


def test_an_expiry_in_the_past_still_asks_for_a_second() -> None:
    blocks = Blocks()
    blocks.add("zone:a", "zone a", BlockKind.BLOCKED, NOW - 5)
    assert retry_after(blocks) == "1"
