"""Ollama's `keep_alive` on the gateway's lifecycle (api.md:54, 432-482; server/routes.go
at ollama/ollama fb3076099, lines 402-414 and 476-485):

- `keep_alive: 0` on an answered request: the answer goes out, then the model's backend is
  unloaded (`model_verbs.unload`: drained, then released as its `idle:` says). Only for a
  caller who may unload (`check_lifecycle`: the admin, or a key with `lifecycle: true`);
  for another the answer is the same and nothing is unloaded: Ollama has no error for it,
  so the log and the event `ollama_keep_alive_refused` say why;
- `POST /api/generate` with no prompt and `keep_alive: 0` unloads at once (Open WebUI's
  eject: `{"model": "NAME:latest", "keep_alive": 0, "prompt": ""}`,
  backend/open_webui/routers/ollama.py `unload_model`); answered `done_reason: "unload"`.
  A caller who may not unload gets 403 in Ollama's format;
- likewise a `POST /api/chat` without messages (server/routes.go 2504-2516, 2644-2653);
- `POST /api/generate` with no prompt otherwise loads it and waits until it is ready
  (`done_reason: "load"`). Any key that may use the model may do this: its first request
  would start or wake the backend by the same admission anyway. A load the gateway
  refuses (blocked, no room) is the error, in Ollama's format;
- a `keep_alive` duration keeps the model loaded at least that long after the answer (or
  the load), a negative one until it is unloaded: a residency floor on its backend
  (`app.lifecycle.floor`: no idle stop, no eviction by another model's start; any stop,
  sleep or unload ends it). It holds VRAM against other clients, so it takes the same
  permission as an unload; for another caller it is not set and the event says why.
  Without `keep_alive` the backend's own `idle_ttl_s` applies (Ollama's 5-minute default
  is not the gateway's).
"""

from __future__ import annotations

import logging
import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.api.deps import plane_of
from app.api.handlers import JSONBody
from app.api.model_verbs import check_lifecycle, lifecycle_target, load, unload
from app.errors import GatewayError
from app.lifecycle.backend import Backend
from app.ollama.wire import Json, nanoseconds, timestamp
from app.services import Services

logger = logging.getLogger(__name__)

REFUSED_EVENT = "ollama_keep_alive_refused"


async def load_or_unload(
    request: Request,
    services: Services,
    model: str,
    name: str,
    stay: float | None,
    *,
    chat: bool = False,
) -> Response:
    """A generate without a prompt (a chat without messages: `chat`, server/routes.go
    2504-2516 and 2644-2653): unload (`keep_alive: 0`) or load `model`."""
    started = time.perf_counter()
    answer: Json = {"model": name, "created_at": ""}
    if chat:
        answer["message"] = {"role": "assistant", "content": ""}
    else:
        answer["response"] = ""
    answer["done"] = True
    if stay == 0:
        check_lifecycle(request, services, model)
        await unload(lifecycle_target(services, model, plane_of(request).registry))
        answer["done_reason"] = "unload"
    else:
        backend = lifecycle_target(services, model, plane_of(request).registry)
        await load(services, backend, wait=True)
        if stay is not None and _permitted(request, services, model) is not None:
            keep(backend, stay)
        answer["done_reason"] = "load"
        answer["total_duration"] = answer["load_duration"] = nanoseconds(
            time.perf_counter() - started
        )
    answer["created_at"] = timestamp()
    return JSONBody(answer)


def after_answer(
    request: Request, services: Services, model: str, stay: float | None, answer: Response
) -> Response:
    """`answer`, followed by what its `keep_alive` asks (when the caller may): an
    unload (0), or a residency floor (a duration; `FOREVER`)."""
    if stay is None:
        return answer
    backend = _permitted(request, services, model)
    return answer if backend is None else ThenKeepAlive(answer, services, backend, stay)


def _permitted(request: Request, services: Services, model: str) -> Backend | None:
    """`model`'s backend when the caller may load and unload it; else None, logged and
    recorded (`REFUSED_EVENT`): Ollama has no error for a keep_alive it does not honour."""
    try:
        check_lifecycle(request, services, model)
        return lifecycle_target(services, model, plane_of(request).registry)
    except GatewayError as err:
        logger.warning("keep_alive not honoured model=%s reason=%s", model, err.message)
        services.events.record(REFUSED_EVENT, model=model, reason=err.message)
        return None


def keep(backend: Backend, stay: float) -> None:
    """A residency floor of `stay` seconds from now (`FOREVER`: until unloaded)."""
    backend.requests.floor.keep(stay, time.monotonic())
    logger.info("keep_alive: resident for at least %ss backend=%s", stay, backend.name)


class ThenKeepAlive(Response):
    """`answer`, then its `keep_alive` on `backend`: an unload (0) in a task the services
    own (the client has its whole answer first; the unload drains whatever else is in
    flight), or a residency floor from the answer's end."""

    def __init__(self, answer: Response, services: Services, backend: Backend, stay: float) -> None:
        self._answer = answer
        self._services = services
        self._backend = backend
        self._stay = stay
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._answer(scope, receive, send)
        finally:
            if self._stay == 0:
                logger.info("keep_alive 0: unloading after the answer backend=%s",
                            self._backend.name)  # fmt: skip
                self._services.loads.spawn(unload(self._backend), f"unload:{self._backend.name}")
            else:
                keep(self._backend, self._stay)
