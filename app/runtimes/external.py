"""A server the gateway does not manage: it is only health-checked."""

from __future__ import annotations


class ExternalRuntime:
    kind = "external"
    managed = False

    def __init__(self, url: str) -> None:
        self._url = url

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def exit_code(self) -> int | None:
        return None

    def describe(self) -> str:
        return f"external server at {self._url}"
