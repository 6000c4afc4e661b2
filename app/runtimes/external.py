"""A server the gateway does not manage: it is only health-checked."""

from __future__ import annotations

from app.runtimes.base import RuntimeStatus


class ExternalRuntime:
    kind = "external"
    managed = False
    stop_on_shutdown = False

    def __init__(self, url: str) -> None:
        self._url = url

    async def start(self, gpus: tuple[int, ...] = (0,)) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def status(self) -> RuntimeStatus:
        return RuntimeStatus(running=True, detail="not managed")

    def describe(self) -> str:
        return f"external server at {self._url}"
