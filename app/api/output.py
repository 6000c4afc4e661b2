"""`GET /backends/{name}/logs?tail=N[&follow=1]` (admin): a backend server's own output,
as text/plain, its lines as the server wrote them (a tqdm bar's updates end in `\\r`).

The last `tail` lines (default 100, at most `output.MAX_TAIL`); with `follow=1`, then the
new ones as they come, until the server exits, the client leaves, or the gateway stops.
Sources: a process backend's output file (through its in-memory ring), a docker backend's
container (`GET /containers/{id}/logs` through the socket proxy), a kubernetes backend's
newest pod (`GET .../pods/{pod}/log`). An external backend has none (409).

The output may hold prompts and answers: admin only, and never copied into `/status`,
metrics or events (only a failed start's recognised lines are quoted there,
`app.upstreams.vllm_output`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Final

from fastapi import APIRouter
from starlette.responses import StreamingResponse

from app.api.deps import AdminDep, ServicesDep
from app.errors import (
    BackendUnavailable,
    Conflict,
    ErrorCode,
    InvalidRequest,
    NotFound,
    UnavailableKind,
)
from app.runtimes.base import RuntimeFailure
from app.runtimes.output import MAX_TAIL, OutputSource
from app.tasks import OpenRelays

logger = logging.getLogger(__name__)

router = APIRouter(tags=["admin"], dependencies=[AdminDep])

DEFAULT_TAIL: Final = 100
_TRUE = frozenset({"1", "true", "yes"})
_FALSE = frozenset({"0", "false", "no", ""})


def _tail(value: str) -> int:
    try:
        tail = int(value)
    except ValueError:
        tail = -1
    if not 0 <= tail <= MAX_TAIL:
        raise InvalidRequest(
            f"tail must be a whole number from 0 to {MAX_TAIL}, got {value[:20]!r}", param="tail"
        )
    return tail


def _flag(value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise InvalidRequest(f"follow must be 1 or 0, got {value[:20]!r}", param="follow")


@router.get("/backends/{name}/logs")
async def backend_logs(
    name: str, services: ServicesDep, tail: str = str(DEFAULT_TAIL), follow: str = "0"
) -> StreamingResponse:
    """The backend server's output (text/plain); `follow=1` streams new lines."""
    lines, following = _tail(tail), _flag(follow)
    backend = services.backends.get(name)
    if backend is None:
        raise NotFound(
            f"no backend named {name!r} (configured: {', '.join(services.backends)})",
            code=ErrorCode.BACKEND_NOT_FOUND,
        )
    runtime = backend.runtime
    if not isinstance(runtime, OutputSource):
        raise Conflict(
            f"backend {name!r} has no output the gateway can read ({runtime.describe()})"
        )
    try:
        source = await runtime.logs(tail=lines, follow=following)
    except RuntimeFailure as exc:
        raise BackendUnavailable(
            f"cannot read the output of backend {name!r}: {exc}", kind=UnavailableKind.RUNTIME
        ) from None
    return StreamingResponse(
        _body(source, name, services.relays),
        media_type="text/plain; charset=utf-8",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


async def _body(
    source: AsyncIterator[str], name: str, relays: OpenRelays
) -> AsyncGenerator[bytes, None]:
    """The lines as bytes; ends quietly when the gateway stops (its relays are ended) or
    the source fails after the first byte (the failure is logged: the status is sent)."""
    task = asyncio.current_task()
    assert task is not None
    relays.add(task)
    try:
        async for line in source:
            yield line.encode()
    except asyncio.CancelledError:
        if not relays.ending(task):
            raise  # the client left
        task.uncancel()
    except RuntimeFailure as exc:
        logger.warning("backend output ended early backend=%s error=%s", name, exc)
    finally:
        relays.discard(task)
        closer = getattr(source, "aclose", None)
        if closer is not None:
            await closer()
