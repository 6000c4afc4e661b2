"""A batch of usage is written as one upsert per ledger row (day, key, model, route), its
requests and tokens summed first: the ledger reads the same as row by row."""

from __future__ import annotations

from pathlib import Path

from app.store.base import UsageQuery, UsageRow
from app.store.sqlite import SqliteStore, summed_usage


def row(key: str, prompt: int, completion: int, *, cloud: bool = False) -> UsageRow:
    return UsageRow("2026-11-26", key, "m", "cloud" if cloud else "b", cloud, prompt, completion)


def test_a_batch_is_summed_per_ledger_row_before_it_is_written(tmp_path: Path) -> None:
    batch = [
        row("a", 3, 4),
        row("b", 1, 1),
        row("a", 5, 6),
        row("a", 1, 0),
        row("c", 2, 2, cloud=True),
    ]
    assert len(summed_usage(batch)) == 3
    store = SqliteStore(tmp_path)
    store.open()
    store.write_batch(batch, [])
    store.write_batch([row("a", 10, 10)], [])
    by_key = {r["key"]: r for r in store.usage(UsageQuery(group_by="key"))}
    assert by_key["a"]["requests"] == 4
    assert (by_key["a"]["prompt_tokens"], by_key["a"]["completion_tokens"]) == (19, 20)
    assert by_key["b"]["requests"] == 1
    assert by_key["c"]["cloud_tokens"] == 4
