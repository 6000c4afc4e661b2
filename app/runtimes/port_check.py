"""Before the gateway launches a process backend: does something already answer on the
port its URL names?

A server already there (the orphan of a gateway that could not adopt it, another user's
server, a second gateway's) would answer the health check of the start, which would then
be "ready" in a moment while requests went to that other server, and the server launched
would die of `Address already in use` (vLLM binds its port early, before loading the
model: vllm/entrypoints/launchers/launcher.py:340 `create_server_socket`, called by
`setup_server`). So a start finds the port free first, or is refused
with `PortInUse` (`port_in_use`).

A server of ours that has just been stopped may hold the port for a moment after its
process group was killed (forked workers that inherited the listening socket die a little
after the leader): the port counts as taken only when it still answers `FREE_WAIT_S` on.

The connect attempts run on the event loop (`asyncio.open_connection`), each within
`CONNECT_TIMEOUT_S`; an attempt that times out, or any error other than an answer, counts
as free (the launch then says what is wrong).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Final
from urllib.parse import urlsplit

from app.errors import PORT_IN_USE_REASON
from app.runtimes.base import RuntimeFailure

CONNECT_TIMEOUT_S: Final = 0.5
FREE_WAIT_S: Final = 2.0  # a port that answers: how long it has to let go
RECHECK_S: Final = 0.1
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


class PortInUse(RuntimeFailure):
    """Another server answers on the port a backend's server is to listen on."""


def address_of(url: str) -> tuple[str, int] | None:
    """(host, port) of a backend's URL, the port defaulting by scheme; None when it has
    no host or an unknown scheme without a port."""
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:  # a port out of range
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname, port


def port_in_use_message(backend: str, host: str, port: int) -> str:
    """Why the start of `backend` is refused, for its reason and the requests it fails."""
    where = "" if host in ("127.0.0.1", "localhost", "::1") else f" on {host}"
    return (
        f"{PORT_IN_USE_REASON}port {port}{where} of backend {backend!r} already answers before its "
        "launch (another server: an orphan, another user's server, a second gateway); free "
        f"it or give the backend another port (backends.{backend}.url)"
    )


async def answers(host: str, port: int, *, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether a TCP connect to (host, port) is accepted within `timeout_s`."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def taken(host: str, port: int, *, free_wait_s: float | None = None) -> bool:
    """Whether (host, port) answers and still does `free_wait_s` (default `FREE_WAIT_S`)
    on, polled every `RECHECK_S`: a closed port ends the wait at once."""
    deadline = time.monotonic() + (FREE_WAIT_S if free_wait_s is None else free_wait_s)
    while await answers(host, port):
        if time.monotonic() >= deadline:
            return True
        await asyncio.sleep(RECHECK_S)
    return False
