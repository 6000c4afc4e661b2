"""`keys.yaml`: the client keys, what each may use and how much (see README "Sharing one GPU")."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Priority(StrEnum):
    """A key's priority: the order of its requests in a backend's queue, and vLLM's request
    `priority` on backends with `scheduling: priority` (vLLM runs lower values first)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """Queue order: lower is served first."""
        return _RANK[self]

    @property
    def vllm(self) -> int:
        """vLLM's `priority` field (`--scheduling-policy priority`: lower runs first)."""
        return _RANK[self] - 1


_RANK: Final = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}
