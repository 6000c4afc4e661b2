"""The `--gpu-memory-utilization` grid: values rounded to a step (0.01 by default), as the
share planner (`app/planner/share.py`) chooses and prints them. Pure arithmetic."""

from __future__ import annotations

import math


def decimals(step: float) -> int:
    return max(0, -math.floor(math.log10(step) + 1e-9))


def grid_value(k: int, step: float) -> float:
    return round(k * step, decimals(step) + 2)


def ceil_to_grid(needed: float, total: float, step: float) -> float | None:
    """Smallest grid value ``u`` with ``u x total >= needed``; None if it would exceed 1."""
    k = max(1, math.ceil(needed / total / step - 1e-9))
    while grid_value(k, step) * total < needed:
        k += 1
    value = grid_value(k, step)
    return value if value <= 1 else None


def floor_to_grid(amount: float, total: float, step: float) -> float:
    """Largest grid value ``u`` with ``u x total <= amount``, but at least one step."""
    k = max(1, math.floor(amount / total / step + 1e-9))
    while k > 1 and grid_value(k, step) * total > amount:
        k -= 1
    return min(grid_value(k, step), 1.0)


def decimals_of(value: float) -> int:
    text = f"{value:.6f}".rstrip("0")
    return len(text.split(".")[1]) if "." in text else 0
