"""Whose request a held ticket is: the client key's name and its `weight` (keys.yaml).

Within a priority, a backend's queue serves keys in turn by these (`app.lifecycle.queue`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class KeyShare:
    """A request's client key, as the queue counts turns: its name (every anonymous
    request shares one, `anonymous`; a call without a key, `""`) and its weight."""

    name: str = ""
    weight: int = 1


NO_KEY: Final = KeyShare()
