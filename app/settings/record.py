"""What `/status` says of the configuration running (`config`: its files' digest, when and
how it was loaded) and the reload counter: kept by the services, written by the reloader
(`app.reload.apply`), which sits above the services."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from prometheus_client import CollectorRegistry

from app.metrics import Declare

RESULTS: Final = ("ok", "refused", "failed")


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


@dataclass(frozen=True)
class Loaded:
    """The configuration running now: its files' digest, when and how it was loaded."""

    hash: str
    loaded_at: float
    source: str  # startup, api, sighup, watch

    def view(self) -> dict[str, Any]:
        return {"hash": self.hash, "loaded_at": self.loaded_at, "source": self.source}


class ConfigRecord:
    def __init__(self, directory: Path, registry: CollectorRegistry) -> None:
        self.directory = directory
        self.loaded = Loaded(config_digest(directory), time.time(), "startup")
        self.restart_required: tuple[str, ...] = ()  # changed, not applied
        self.last_refused: dict[str, Any] | None = None
        self.total = Declare(registry).counter(
            "config_reloads",
            "Configuration reloads, by result: ok (applied), refused (invalid: the running "
            "configuration stays), failed (an error while applying).",
            ("result",),
        )
        for result in RESULTS:
            self.total.labels(result)

    def applied(self, digest: str, source: str, restart_required: tuple[str, ...]) -> None:
        self.loaded = Loaded(digest, time.time(), source)
        self.restart_required = restart_required
        self.last_refused = None
        self.total.labels("ok").inc()

    def refused(self, source: str, problems: list[str]) -> None:
        self.last_refused = {"at": time.time(), "source": source, "problems": problems}
        self.total.labels("refused").inc()

    def failed(self) -> None:
        self.total.labels("failed").inc()

    def view(self) -> dict[str, Any]:
        """`/status`'s `config`."""
        return {
            **self.loaded.view(),
            "directory": str(self.directory),
            "restart_required": list(self.restart_required),
            "last_refused": self.last_refused,
        }
