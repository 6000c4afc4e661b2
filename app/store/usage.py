"""The usage ledger: each finished request's tokens, per client key, model, route (the
backend or provider that answered) and UTC day, kept in the store (`app.store`), and what
is read back from it: `GET /usage`, the page's per-key panel, and, at start, today's
cloud spend of every key (`daily_cloud_tokens` survive restarts).

The request path only queues (`record`, the activity ring's sink); the store's writer
batches. At start today's spend is read before the first request is served; when it
cannot be read, the keys with a daily budget are kept off the cloud (fail closed, reason
`key_cloud_budget_unreadable`) and the read is retried every `BUDGET_RETRY_S` until it
works; when the database was set aside as unreadable, today's spend is lost and those
keys stay off the cloud until the next UTC day.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry

from app.activity import Activity, Entry
from app.keys.ring import KeyRing
from app.settings import Settings
from app.store.base import StoreError, UsageQuery, UsageRow
from app.store.sqlite import SqliteStore
from app.store.writer import DAY_S, StoreMetrics, StoreWriter
from app.tasks import OwnedTasks

logger = logging.getLogger(__name__)

BUDGET_RETRY_S: Final = 5.0
PANEL_DAYS: Final = 7
Price = tuple[float, float]  # per million tokens: (input, output)


def utc_day(at: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(at))


class UsageLedger:
    def __init__(
        self,
        writer: StoreWriter,
        providers: Mapping[str, Price | None],
        *,
        budget_retry_s: float = BUDGET_RETRY_S,
    ) -> None:
        self.writer = writer
        self._providers = dict(providers)  # provider name -> price (None: not given)
        self._budget_retry_s = budget_retry_s
        self._tasks = OwnedTasks()
        self._day = (-1, "")  # (days since the epoch, its `utc_day`): one strftime a day

    def set_providers(self, providers: Mapping[str, Price | None]) -> None:
        """The cloud providers after a configuration reload: what counts as cloud (a
        key's daily budget, read back at start) and their prices."""
        self._providers = dict(providers)

    # -- the request path -------------------------------------------------------------

    def record(self, entry: Entry) -> None:
        """Queue a finished request (no I/O): its usage row when it reached a route."""
        row = None
        if entry.route is not None and entry.model is not None:
            number = int(entry.at // DAY_S)
            if number != self._day[0]:
                self._day = (number, utc_day(entry.at))
            row = UsageRow(
                day=self._day[1],
                key=entry.key or "-",
                model=entry.model,
                route=entry.route,
                cloud=entry.route in self._providers,
                prompt_tokens=max(0, entry.prompt_tokens or 0),
                completion_tokens=max(0, entry.completion_tokens or 0),
            )
        self.writer.add(row, entry)

    # -- start and stop ---------------------------------------------------------------

    async def start(self, keys: KeyRing, activity: Activity, *, restore_activity: bool) -> None:
        """Open the store, read today's cloud spend into the keys (fail closed when it
        cannot be), refill the activity ring, then start the writer."""
        store = self.writer.store
        try:
            await self.writer.run(store.open)
        except StoreError as exc:
            logger.error("store unreadable at start error=%s", exc.message)
        if store.usage_lost:
            names = keys.cloud_spent_unknown(time.time())
            if names:
                logger.error("today's cloud spend was in the database set aside: keys kept "
                             "off the cloud until 00:00 UTC keys=%s", ",".join(names))  # fmt: skip
        elif not await self._read_budgets(keys):
            self._tasks.spawn(self._retry_budgets(keys), "store-budget-read")
        if restore_activity:
            try:
                activity.restore(await self.writer.run(store.recent_activity, activity.size))
            except StoreError as exc:
                logger.warning("saved activity not read error=%s", exc.message)
        activity.persist_to(self.record)
        self.writer.start()

    async def _read_budgets(self, keys: KeyRing, *, first: bool = True) -> bool:
        now = time.time()
        try:
            spent = await self.writer.run(self.writer.store.cloud_spent, utc_day(now))
        except StoreError as exc:
            names = keys.cloud_spent_unknown(now)
            if first:
                logger.error("today's cloud spend unreadable: keys kept off the cloud until "
                             "it is read keys=%s error=%s", ",".join(names) or "-",
                             exc.message)  # fmt: skip
            return False
        keys.restore_cloud_spent(spent, now)
        return True

    async def _retry_budgets(self, keys: KeyRing) -> None:
        while True:
            await asyncio.sleep(self._budget_retry_s)
            if await self._read_budgets(keys, first=False):
                logger.info("today's cloud spend read: keys may use the cloud again")
                return

    async def close(self) -> None:
        await self._tasks.close()
        await self.writer.close()

    def status(self) -> dict[str, Any]:
        return self.writer.status()

    # -- reading ----------------------------------------------------------------------

    async def usage(self, query: UsageQuery) -> list[dict[str, Any]]:
        rows = await self.writer.run(self.writer.store.usage, query)
        if query.group_by == "route":
            for row in rows:
                row["cost"] = self._cost(row["route"], row["prompt_tokens"],
                                         row["completion_tokens"])  # fmt: skip
        return rows

    def _cost(self, route: str, prompt: int, completion: int) -> float | None:
        price = self._providers.get(route)
        if price is None:
            return None
        return round((prompt * price[0] + completion * price[1]) / 1e6, 6)

    async def panel(self, now: float, key: str | None = None) -> dict[str, Any]:
        """Per key, today and the last 7 days (today included): local and cloud tokens
        and the estimated cost of the cloud ones (`cost_per_mtok`; `cost_complete` is
        false when a provider used has no price)."""
        today = utc_day(now)
        since = utc_day(now - (PANEL_DAYS - 1) * DAY_S)
        rows = await self.writer.run(self.writer.store.usage_by_key_route, since, today)
        keys: dict[str, dict[str, Any]] = {}
        for row in rows:
            if key is not None and row["key"] != key:
                continue
            views = keys.setdefault(row["key"], {"today": _empty(), "last_7_days": _empty()})
            for span in ("today", "last_7_days") if row["day"] == today else ("last_7_days",):
                self._add(views[span], row)
        return {
            "today": today,
            "since": since,
            "keys": [{"key": name, **views} for name, views in sorted(keys.items())],
        }

    def _add(self, view: dict[str, Any], row: dict[str, Any]) -> None:
        tokens = row["prompt_tokens"] + row["completion_tokens"]
        if not row["cloud"]:
            view["local_tokens"] += tokens
            return
        view["cloud_tokens"] += tokens
        cost = self._cost(row["route"], row["prompt_tokens"], row["completion_tokens"])
        if cost is None:
            view["cost_complete"] = False
        else:
            view["cost"] = round(view["cost"] + cost, 6)


def _empty() -> dict[str, Any]:
    return {"local_tokens": 0, "cloud_tokens": 0, "cost": 0.0, "cost_complete": True}


def prices_of(settings: Settings) -> dict[str, Price | None]:
    """Each cloud provider of `settings` by name, with its price (None: not given)."""
    cloud = settings.cloud_providers
    return {
        name: None if p.cost_per_mtok is None else (p.cost_per_mtok.input, p.cost_per_mtok.output)
        for name, p in (cloud.providers.items() if cloud is not None else ())
    }


def build_ledger(settings: Settings, registry: CollectorRegistry) -> UsageLedger:
    """The ledger over `state.db` in the state directory, with the providers' prices."""
    writer = StoreWriter(
        SqliteStore(settings.state_dir), settings.store, metrics=StoreMetrics(registry)
    )
    return UsageLedger(writer, prices_of(settings))
