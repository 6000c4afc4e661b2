"""Ollama's wire conventions, as its server writes them (pure: no I/O).

Facts from Ollama's API reference (docs/api.md) and its Go types (api/types.go) at
ollama/ollama fb3076099, cited as `api.md:LINE` and `types.go:LINE`:
- durations are nanoseconds (api.md:26-28); `created_at` and `expires_at` are Go
  `time.Time`, written as RFC 3339 with fractional seconds (types.go:531, 841);
- an error is `{"error": "..."}` with the HTTP status (types.go:26, `StatusError`);
- `keep_alive` is a number of seconds or a Go duration string (`"5m"`, `"1h30m"`); a
  negative one is "forever" (types.go:1243-1271, `Duration.UnmarshalJSON`);
- a model name is `model:tag`, the tag `latest` when none is given (api.md:22-24).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from app.errors import InvalidRequest

Json = dict[str, Any]

NS: Final = 1_000_000_000
LATEST: Final = ":latest"
FOREVER: Final = math.inf
# The version `GET /api/version` reports: the Ollama release whose API this gateway
# follows (v0.32.15, the newest release tag of the snapshot read). Open WebUI parses it as
# dotted integers (backend/open_webui/routers/ollama.py, `get_ollama_versions`).
VERSION: Final = "0.32.15"

# Go's `time.ParseDuration` units (time/format.go, `unitMap`), in seconds.
_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
                 "m": 60.0, "h": 3600.0}  # fmt: skip
_PART: Final = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)")


def timestamp(at: float | None = None) -> str:
    """A Go `time.Time` as JSON writes it in UTC: `2023-08-04T19:22:45.499127Z`."""
    moment = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def nanoseconds(seconds: float) -> int:
    return max(0, round(seconds * NS))


def error_body(message: str) -> Json:
    return {"error": message}


def keep_alive_s(value: object) -> float | None:
    """`keep_alive` in seconds: None when absent (the server's default applies),
    `FOREVER` for a negative one; an unreadable one is a 400, as Ollama's is."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidRequest(f"keep_alive: unsupported type 'bool' ({value!r})")
    if isinstance(value, int | float):
        return FOREVER if value < 0 else float(value)
    if isinstance(value, str):
        seconds = go_duration_s(value)
        if seconds is None:
            raise InvalidRequest(f'time: invalid duration "{value}" (keep_alive)')
        return FOREVER if seconds < 0 else seconds
    raise InvalidRequest(f"keep_alive: unsupported type '{type(value).__name__}'")


def go_duration_s(text: str) -> float | None:
    """Go's `time.ParseDuration` (`"300ms"`, `"-1.5h"`, `"2h45m"`; `"0"` alone needs no
    unit), in seconds; None for anything else."""
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == "0":
        return 0.0
    if not body:
        return None
    total, at = 0.0, 0
    while at < len(body):
        match = _PART.match(body, at)
        if match is None:
            return None
        total += float(match.group(1)) * _UNITS[match.group(2)]
        at = match.end()
    return sign * total


def tagged(name: str) -> str:
    """A served model id as Ollama lists it: with its tag (`latest` when it has none)."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def untagged(name: str, known: Callable[[str], bool]) -> str:
    """The served id a client's `name` stands for: as given when `known`, else without
    the `:latest` that Ollama's clients add (Open WebUI's eject adds it; its routers
    /ollama.py `unload_model`)."""
    if known(name) or not name.endswith(LATEST):
        return name
    bare = name.removesuffix(LATEST)
    return bare if known(bare) else name
