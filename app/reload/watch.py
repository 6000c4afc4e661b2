"""The config directory's files: their digest (`/status`'s `config.hash`) and the watch of
`serve --watch-config`, which polls them every `WATCH_INTERVAL_S` and reloads when their
contents change (no new dependency: a read and a hash of a few small files)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S: Final = 2.0


def config_digest(directory: Path) -> str:
    """SHA-256 over the names and contents of the directory's YAML files (its first 16
    hex digits): what the running configuration was loaded from."""
    digest = hashlib.sha256()
    try:
        files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
    except OSError:
        files = []
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        digest.update(path.name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()[:16]


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
