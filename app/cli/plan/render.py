"""Text layout shared by the `plan` commands: GiB rounding, key/value rows, tables."""

from __future__ import annotations

from collections.abc import Sequence

from app.planner.units import bytes_to_gib


def gib3(n_bytes: float) -> float:
    return round(bytes_to_gib(n_bytes), 3)


def key_values(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in rows)


def table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    rows = [list(header), *(list(row) for row in body)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
