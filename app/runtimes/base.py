"""The runtime seam: how a backend's server is started, stopped and watched.

A runtime only runs things; readiness (the server answering `/health`) is decided by the
backend's lifecycle, which polls the server while `status()` says it is still running.
`external` runs nothing; `process` runs a local command; `docker` starts and stops an
existing container through the Docker Engine API (usually behind a socket proxy);
`kubernetes` scales an existing Deployment or StatefulSet between 0 and 1 replica.

Transport errors never escape a runtime: every failure is a `RuntimeFailure` whose message
is written for the operator (what failed, and which config key or permission to fix).
`read_refusal` reads the body of an API's refused stream for that message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from app.upstreams.control_http import HTTPError, Response


class RuntimeFailure(Exception):
    """A runtime could not do what was asked; the message says why, for the operator."""


async def read_refusal(response: Response) -> None:
    """Read the body of a streamed response that refused the call (its status error
    quotes it), then close it; a body cut short is not a second error."""
    try:
        await response.aread()
    except HTTPError:
        pass
    finally:
        await response.aclose()


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    """What the runtime knows about its server right now.

    `running` is False once the server has exited (or was never started); `exit_code`
    is set when it exited and the runtime knows the code. `detail` is one line for
    logs and `/backends` (for example "exited (137), OOM-killed" or "health: starting").
    `ready` is None when the runtime cannot tell readiness (the health check alone
    decides); False when it knows the server is not ready yet (kubernetes: no ready
    endpoint), so a passing health check is not enough and `detail` says what it waits
    for in the backend's start progress.
    `stopped_by_owner`: not running because its owner, not the gateway, stopped it
    (kubernetes `scale: external`: KEDA or an HPA scaled it to 0). It did not fail: a
    ready backend goes stopped, and a start waits (up to start_timeout_s) for the owner to
    run it again, with `detail` as its progress.
    """

    running: bool
    exit_code: int | None = None
    detail: str = ""
    ready: bool | None = None
    stopped_by_owner: bool = False
    # The GPUs the running server was started on, when the runtime knows (a placement's
    # container, a process's record): where a server found at gateway start is.
    gpus: tuple[int, ...] | None = None


class Runtime(Protocol):
    kind: str
    managed: bool  # False: the gateway does not start or stop it (external)
    # True: the gateway stops it when the gateway stops (its own child processes).
    # False: it outlives the gateway and is adopted when the gateway starts again.
    stop_on_shutdown: bool

    async def start(self, gpus: tuple[int, ...] = (0,)) -> None:
        """Start the server on `gpus` (where admission placed it: the process runtime
        shows the child only those, the docker runtime starts the placement's container,
        Kubernetes lets the cluster place it); return once it was launched (not once it is
        ready).

        Starting a server that already runs is not an error."""

    async def stop(self) -> None:
        """Stop the server and everything it started; return once it is gone.

        Stopping a server that is not running is not an error."""

    async def status(self) -> RuntimeStatus:
        """Ask whether the server runs; raise `RuntimeFailure` when that cannot be known
        (for example the Docker proxy is unreachable)."""

    def describe(self) -> str:
        """One line for logs and errors: what this runtime runs."""
