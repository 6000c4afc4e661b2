"""Today's cloud spend read back from the store at start (`app.store.usage`): restored
into the keys; failing closed when it cannot be read (retried until it can), and for the
rest of the UTC day when the database was set aside as unreadable."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from app.activity import Activity, Entry, WaitKind
from app.keys.metrics import KeyMetrics
from app.keys.ring import KeyRing
from app.settings.keys import KeysConfig
from app.store.base import StoreError
from app.store.sqlite import SqliteStore
from app.store.usage import UsageLedger
from app.store.writer import StoreWriter
from tests.fakes.waits import until


def ring() -> KeyRing:
    config = KeysConfig.model_validate(
        {"keys": {"agents": {"key_env": "K", "daily_cloud_tokens": 30}}}
    )
    return KeyRing.build((), config, KeyMetrics(CollectorRegistry()), ["cloud"],
                         environ={"K": "sk-k"})  # fmt: skip


def entry(tokens: int) -> Entry:
    return Entry(time.time(), "agents", "reasoning", "cloud", "chat", 200, tokens, 0, 0.0,
                 WaitKind.NONE, 0, 0.1)  # fmt: skip


class Unreadable(SqliteStore):
    """The real store, whose budget read fails until `readable` is set."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.readable = asyncio.Event()

    def cloud_spent(self, day: str) -> dict[str, int]:
        if not self.readable.is_set():
            raise StoreError(f"cannot read the cloud budgets from {self.location}: locked")
        return super().cloud_spent(day)


async def test_the_spend_is_restored_from_the_ledger(tmp_path: Path) -> None:
    first = UsageLedger(StoreWriter(SqliteStore(tmp_path)), {"cloud": None})
    await first.start(ring(), Activity(), restore_activity=True)
    first.record(entry(20))
    first.record(entry(14))
    await first.close()

    keys, activity = ring(), Activity()
    second = UsageLedger(StoreWriter(SqliteStore(tmp_path)), {"cloud": None})
    await second.start(keys, activity, restore_activity=True)
    (key,) = keys.keys
    assert key.view()["cloud_tokens_today"] == 34
    use = key.admit()
    assert (use.cloud, use.budget_spent, use.budget_unknown) == (False, True, False)
    assert len(activity) == 2  # the saved entries are back in the ring
    await second.close()


async def test_an_unreadable_spend_fails_closed_until_it_is_read(tmp_path: Path) -> None:
    store = Unreadable(tmp_path)
    ledger = UsageLedger(StoreWriter(store), {"cloud": None}, budget_retry_s=0.01)
    keys = ring()
    await ledger.start(keys, Activity(), restore_activity=False)
    (key,) = keys.keys
    use = key.admit()
    assert (use.cloud, use.budget_unknown) == (False, True)
    use.finish("error")
    assert key.view()["cloud_budget_unknown"] is True

    store.readable.set()

    def cloud_allowed() -> bool:
        use = key.admit()
        use.finish("served")
        return use.cloud

    await until(cloud_allowed, what="the spend read by the retry")
    assert key.view()["cloud_budget_unknown"] is False
    await ledger.close()


async def test_a_database_set_aside_keeps_budgeted_keys_off_the_cloud_today(
    tmp_path: Path,
) -> None:
    (tmp_path / "state.db").write_bytes(b"not a database" * 500)
    ledger = UsageLedger(StoreWriter(SqliteStore(tmp_path)), {"cloud": None})
    keys = ring()
    await ledger.start(keys, Activity(), restore_activity=True)
    assert (tmp_path / "state.db.corrupt").exists()
    (key,) = keys.keys
    use = key.admit()
    assert (use.cloud, use.budget_unknown) == (False, True)
    await ledger.close()


async def test_a_provider_added_by_a_reload_counts_as_cloud_after_a_restart(
    tmp_path: Path,
) -> None:
    """`set_providers` (a reload's new cloud_providers.yaml): its tokens are saved as cloud
    spend, so the budget read back at the next start has them (they were saved as local:
    a key could go over its daily_cloud_tokens after a restart)."""
    first = UsageLedger(StoreWriter(SqliteStore(tmp_path)), {})  # "cloud" not known yet
    await first.start(ring(), Activity(), restore_activity=True)
    first.set_providers({"cloud": None})
    first.record(entry(20))
    await first.close()

    keys = ring()
    second = UsageLedger(StoreWriter(SqliteStore(tmp_path)), {"cloud": None})
    await second.start(keys, Activity(), restore_activity=True)
    (key,) = keys.keys
    assert key.view()["cloud_tokens_today"] == 20
    await second.close()
