"""`store:` settings: how usage and activity are written to the state directory's
database (`app.store`). Pure.

- `flush_interval_s` (1.0): queued rows are written at least this often;
- `flush_rows` (256): or as soon as this many wait;
- `queue_max` (10,000): rows kept per queue while the store cannot be written; beyond it
  the oldest are dropped (counted);
- `activity_retention_days` (30) and `activity_retention_rows` (100,000): activity kept
  in the database (the usage ledger is kept: one row per day, key, model and route);
- `activity_restore` (true): the ring of `GET /activity` starts with the newest saved
  entries.
"""

from __future__ import annotations

from pydantic import Field, PositiveFloat, PositiveInt

from app.settings.base import StrictConfig


class StoreConfig(StrictConfig):
    flush_interval_s: PositiveFloat = Field(
        1.0, description="Queued usage and activity rows are written at least this often."
    )
    flush_rows: PositiveInt = Field(256, description="Or as soon as this many wait.")
    queue_max: PositiveInt = Field(
        10_000,
        description=(
            "Rows kept per queue while the store cannot be written; beyond, the oldest are dropped."
        ),
    )
    activity_retention_days: PositiveFloat = Field(
        30.0, description="Activity kept in the database this many days."
    )
    activity_retention_rows: PositiveInt = Field(
        100_000, description="At most this many activity rows kept."
    )
    activity_restore: bool = Field(
        True, description="GET /activity starts with the newest saved entries."
    )
