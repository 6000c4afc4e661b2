"""The watch of `serve --watch-config`: it polls the config directory's digest (`/status`'s
`config.hash`, `app.settings.record.config_digest`) every `WATCH_INTERVAL_S` and reloads
when the files' contents change (no new dependency: a read and a hash of a few small
files)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from app.settings.record import config_digest

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S: Final = 2.0


class ConfigWatcher:
    """Polls the digest; calls `reload()` when it moved from the last one seen (a refused
    reload is not retried until the files change again)."""

    def __init__(
        self,
        directory: Path,
        reload: Callable[[], Awaitable[object]],
        *,
        interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self._directory = directory
        self._reload = reload
        self._interval_s = interval_s
        self._seen = config_digest(directory)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            now = await asyncio.to_thread(config_digest, self._directory)
            if now == self._seen:
                continue
            self._seen = now
            logger.info("config files changed, reloading directory=%s", self._directory)
            try:
                await self._reload()
            except Exception as exc:  # refused: said by the reloader; keep watching
                logger.debug("watched reload ended error=%s", exc)
