"""The store's interface: what a backend must do, whatever it keeps its data in (SQLite in
the state directory today; a shared database for several gateways later).

Every method is synchronous and may block: callers run them in the store's own thread
(`app.store.writer.StoreWriter`), never on the event loop. A failure is a `StoreError`
(its message names the location and the cause; never data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from app.activity import Entry


class StoreError(Exception):
    """The store could not be read or written (`message` names where and why)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One request's share of the ledger: added to its (day, key, model, route) row."""

    day: str  # UTC, YYYY-MM-DD
    key: str
    model: str
    route: str  # the backend or provider that answered
    cloud: bool  # `route` is a cloud provider
    prompt_tokens: int
    completion_tokens: int

    @property
    def cloud_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens if self.cloud else 0


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """Days `since` to `until` (UTC, inclusive; None: unbounded), one key or all, grouped
    by `model`, `key`, `route` or `day`."""

    since: str | None = None
    until: str | None = None
    key: str | None = None
    group_by: str = "model"


class Store(Protocol):
    """What the gateway keeps across restarts (see the module docstring)."""

    @property
    def location(self) -> str:
        """Where it is (a path, a URL without credentials), for messages and `/status`."""
        ...

    def open(self) -> None:
        """Create or migrate the schema; set aside what cannot be read (logged)."""
        ...

    @property
    def set_aside(self) -> str | None:
        """Where unreadable data was moved at `open` (None: nothing was)."""
        ...

    @property
    def usage_lost(self) -> bool:
        """What the store held was set aside at `open`: today's cloud spend is unknown."""
        ...

    def read_sections(self) -> dict[str, Any]: ...

    def write_sections(self, sections: dict[str, Any]) -> None:
        """Replace every section in one transaction (all or nothing)."""
        ...

    def write_section(self, name: str, value: str) -> None:
        """Replace one section (`value`: its JSON), or add it."""
        ...

    def check_writable(self) -> None: ...

    def write_batch(self, usage: list[UsageRow], activity: list[Entry]) -> None:
        """Add usage rows and activity entries in one transaction."""
        ...

    def cloud_spent(self, day: str) -> dict[str, int]:
        """Cloud tokens per key on `day`."""
        ...

    def usage(self, query: UsageQuery) -> list[dict[str, Any]]:
        """Rows `{group: value, requests, prompt_tokens, completion_tokens,
        cloud_tokens}` (and `cloud` per route), largest first."""
        ...

    def usage_by_key_route(self, since: str, until: str) -> list[dict[str, Any]]:
        """Rows `{key, day, route, cloud, prompt_tokens, completion_tokens}`."""
        ...

    def recent_activity(self, limit: int) -> list[Entry]:
        """The newest `limit` entries, oldest first."""
        ...

    def prune_activity(self, before: float, keep_rows: int) -> int:
        """Drop entries older than `before` (Unix seconds) and beyond the newest
        `keep_rows`; how many went."""
        ...

    def close(self) -> None: ...
