"""The runtime seam: how a backend's server process is started, stopped and watched.

A runtime only runs things; readiness (the server answering `/health`) is decided by the
backend's lifecycle, which polls the server while `exit_code()` says it is still alive.
`external` runs nothing; `process` runs a command; `docker` (next) runs a container.
"""

from __future__ import annotations

from typing import Protocol


class RuntimeError_(Exception):
    """A runtime could not do what was asked; the message says why, for the operator."""


class Runtime(Protocol):
    kind: str
    managed: bool  # False: the gateway does not start or stop it (external)

    async def start(self) -> None:
        """Start the server; return once it was launched (not once it is ready)."""

    async def stop(self) -> None:
        """Stop the server and everything it started; return once it is gone."""

    def exit_code(self) -> int | None:
        """The exit code once the server has exited on its own, else None."""

    def describe(self) -> str:
        """One line for logs and errors: what this runtime runs."""
