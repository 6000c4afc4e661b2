"""The store's async side: one thread for every store operation, and batched writes of
usage and activity.

- `run(fn, ...)` awaits a store operation in the store's thread; `call(fn, ...)` is the
  same for synchronous callers (start-up, the state sections, whose writes must be done
  before their caller goes on): the caller waits, but the I/O is in the thread.
- `add(usage, entry)` is all the request path does: two appends to bounded queues. The
  owned flush task writes what is queued every `flush_interval_s`, or as soon as
  `flush_rows` are waiting, in one transaction (`Store.write_batch`).
- A write that fails is logged, counted (`microscheduler_store_write_failures_total`),
  shown (`status()`, in `/status` `state.usage`) and retried with the next batch; the
  queues stay bounded (`queue_max`): beyond it the oldest rows are dropped and counted
  (`microscheduler_store_dropped_total`).
- Activity older than `activity_retention_days`, or beyond the newest
  `activity_retention_rows`, is pruned at start and every hour.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry

from app.activity import Entry
from app.metrics import Declare
from app.settings.store import StoreConfig
from app.store.base import Store, StoreError, UsageRow
from app.tasks import cancel_and_wait, spawn

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
PRUNE_EVERY_S: Final = 3600.0
DAY_S: Final = 86400


class StoreMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        new = Declare(registry)
        self.writes = new.counter(
            "store_writes", "Batches of usage and activity committed to the store."
        )
        self.failures = new.counter(
            "store_write_failures",
            "Batches of usage and activity the store could not write (kept and retried).",
        )
        self.dropped = new.counter(
            "store_dropped",
            "Usage and activity rows dropped unwritten: the queue was full (queue_max).",
        )
        self.pending = new.gauge(
            "store_pending_rows", "Usage and activity rows waiting for their batch to be written."
        )


class StoreWriter:
    def __init__(
        self,
        store: Store,
        config: StoreConfig | None = None,
        *,
        metrics: StoreMetrics | None = None,
    ) -> None:
        self.store = store
        self.config = config or StoreConfig()
        self._metrics = metrics
        self._thread: int | None = None  # the store's thread, once it runs
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="store", initializer=self._started
        )
        self._usage: deque[UsageRow] = deque()
        self._activity: deque[Entry] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()
        self._writing = 0  # rows of the batch being written
        self.error: str | None = None  # the last batch's failure, None once one is written
        self.dropped = 0
        self.commits = 0
        if metrics is not None:
            metrics.pending.set_function(lambda: self.pending)  # read when scraped

    # -- the store's thread -----------------------------------------------------------

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn` in the store's thread, waited for (from that thread itself: directly)."""
        if threading.get_ident() == self._thread:
            return fn(*args, **kwargs)
        return self._executor.submit(fn, *args, **kwargs).result()

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """`fn` queued in the store's thread, not waited for: the operations run in the
        order they were queued (one worker)."""
        return self._executor.submit(fn, *args, **kwargs)

    def _started(self) -> None:
        self._thread = threading.get_ident()

    # -- the request path -------------------------------------------------------------

    def add(self, usage: UsageRow | None, entry: Entry) -> None:
        """Queue one request's rows (no I/O, no await): two appends and a length check."""
        if usage is not None:
            self._usage.append(usage)
        self._activity.append(entry)
        waiting = len(self._usage) + len(self._activity)
        if waiting > self.config.queue_max:  # then perhaps one queue is over it
            self._bound()
        if waiting >= self.config.flush_rows and self._wake is not None:
            self._wake.set()

    def _bound(self) -> None:
        limit = self.config.queue_max
        for queue in (self._usage, self._activity):
            over = len(queue) - limit
            for _ in range(max(0, over)):
                queue.popleft()
            if over > 0:
                self.dropped += over
                if self._metrics is not None:
                    self._metrics.dropped.inc(over)

    # -- the flush task ---------------------------------------------------------------

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = spawn(self._loop(), "store-flush")

    async def _loop(self) -> None:
        assert self._wake is not None
        next_prune = 0.0
        while True:
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + PRUNE_EVERY_S
                await self._prune()
            try:
                async with asyncio.timeout(self.config.flush_interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write what is queued in one transaction; on failure keep it for the next."""
        async with self._flushing:
            if not self._usage and not self._activity:
                return
            usage, activity = list(self._usage), list(self._activity)
            self._usage.clear()
            self._activity.clear()
            self._writing = len(usage) + len(activity)
            try:
                await self.run(self.store.write_batch, usage, activity)
            except StoreError as exc:
                self._usage.extendleft(reversed(usage))
                self._activity.extendleft(reversed(activity))
                self._bound()
                if self._metrics is not None:
                    self._metrics.failures.inc()
                if self.error is None:
                    logger.warning("usage and activity not saved, kept for the next try "
                                   "error=%s", exc.message)  # fmt: skip
                self.error = exc.message
                return
            finally:
                self._writing = 0
            self.commits += 1
            if self._metrics is not None:
                self._metrics.writes.inc()
            if self.error is not None:
                logger.info("usage and activity saved again location=%s", self.store.location)
                self.error = None

    async def _prune(self) -> None:
        config = self.config
        before = time.time() - config.activity_retention_days * DAY_S
        try:
            gone = await self.run(self.store.prune_activity, before, config.activity_retention_rows)
        except StoreError as exc:
            logger.warning("activity not pruned error=%s", exc.message)
            return
        if gone:
            logger.info("activity pruned rows=%d", gone)

    @property
    def pending(self) -> int:
        """Rows not written yet: queued, or in the batch being written."""
        return len(self._usage) + len(self._activity) + self._writing

    def status(self) -> dict[str, Any]:
        """`/status` `state.usage`: rows waiting, dropped, and the last failure."""
        return {
            "pending": self.pending,
            "dropped": self.dropped,
            "error": self.error,
        }

    async def close(self) -> None:
        """Stop the flush task, write what is queued (a last try), stop the thread."""
        await cancel_and_wait(self._task)
        self._task = None
        await self.flush()
        if self.error is not None:
            logger.error("usage and activity not saved at shutdown rows=%d error=%s",
                         len(self._usage) + len(self._activity), self.error)  # fmt: skip
        await self.run(self.store.close)
        self._executor.shutdown(wait=True)
