"""The fake vLLM's sleep mode (``VLLM_SERVER_DEV_MODE=1`` only): ``/sleep``, ``/wake_up``,
``/is_sleeping``, ``/collective_rpc`` (``reload_weights``) and ``/reset_prefix_cache``, as
vllm/entrypoints/serve/dev/{sleep,rpc,cache}/api_router.py answer them, with a wake's
modelled time (``--wake-gib-per-s``: ``FakeConfig.wake_s``) and a failing wake after
``--wake-fail-after`` cycles (a 500 as vLLM answers it; the server stays asleep)."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from app.sim.engine import PauseMode
from app.sim.state import FakeState, error_response, json_response
from app.sim.text import ApiError, dumps, query_error

_PAUSE_MODES: dict[str, PauseMode] = {"abort": "abort", "wait": "wait", "keep": "keep"}


# What vLLM 0.33 answers when the engine's wake_up raises, e.g. out of memory mapping the
# weights back (vLLM #48680): the engine core reports "Call to wake_up method failed: ..."
# (vllm/v1/engine/core.py:1850), the client raises it as a plain Exception
# (vllm/v1/engine/core_client.py:941), and the server's catch-all handler answers 500
# InternalServerError (vllm/entrypoints/serve/exception_handling/error_response.py:93-96).
WAKE_FAILURE = "Call to wake_up method failed: CUDA Error: out of memory"


def wake_failure() -> ApiError:
    """The fake's failing wake (``--wake-fail-after``), as vLLM answers one."""
    return ApiError(500, WAKE_FAILURE, "InternalServerError")


class SleepMode(FakeState):
    """The sleep-mode handlers of the fake server (see ``app.sim.vllm.FakeVllm``)."""

    async def sleep(self, request: web.Request) -> web.StreamResponse:
        """vllm/entrypoints/serve/dev/sleep/api_router.py ``sleep``: ``level`` an int in
        0..2 (default 1), ``mode`` abort|wait|keep (FastAPI validates both: a 400
        validation error), ``{"status": "sleeping", "level": N}``."""
        self.record(request, None)
        level_s, mode = request.query.get("level", "1"), request.query.get("mode", "abort")
        try:
            level = int(level_s.strip())
        except ValueError:
            msg = "Input should be a valid integer, unable to parse string as an integer"
            return error_response(query_error("level", "int_parsing", msg, level_s))
        if not 0 <= level <= 2:
            kind, bound, msg = (
                ("greater_than_equal", "ge", "greater than or equal to 0")
                if level < 0
                else ("less_than_equal", "le", "less than or equal to 2")
            )
            ctx = {bound: 0 if level < 0 else 2}
            err = query_error("level", kind, f"Input should be {msg}", level_s, ctx)
            return error_response(err)
        pause_mode = _PAUSE_MODES.get(mode)
        if pause_mode is None:
            expected = "'abort', 'wait' or 'keep'"
            msg = f"Input should be {expected}"
            return error_response(
                query_error("mode", "literal_error", msg, mode, {"expected": expected})
            )
        await self.engine.sleep(level, pause_mode)
        self.vram.follow(self.engine.memory_sleeping)
        return json_response(dumps({"status": "sleeping", "level": level}))

    async def wake_up(self, request: web.Request) -> web.StreamResponse:
        """vllm/entrypoints/serve/dev/sleep/api_router.py ``wake_up``: ``tags``
        repeatable, none = all; ``{"status": "awake"|"sleeping", "tags": [...]|null}``,
        "sleeping" while some memory still sleeps (vllm/v1/engine/core.py ``wake_up``)."""
        self.record(request, None)
        tags: list[str] | None = request.query.getall("tags", []) or None
        failing = self.config.wake_fail_after
        if failing is not None and self.vram.cycles >= failing and self.engine.memory_sleeping:
            return error_response(wake_failure())
        engine = self.engine
        weights = engine.sleep_level == 1 and "weights" in engine.sleeping_tags
        if weights and (tags is None or "weights" in tags):  # level 1: from host RAM
            await self._modelled_wake()
        fully_awake = self.engine.wake_up(tags)
        self.vram.follow(self.engine.memory_sleeping)
        body = {"status": "awake" if fully_awake else "sleeping", "tags": tags}
        return json_response(dumps(body))

    async def _modelled_wake(self) -> None:
        """Take the wake's modelled time (``--wake-gib-per-s``), counted in the stats."""
        seconds = self.config.wake_s()
        if seconds > 0:
            await asyncio.sleep(seconds)
        self.stats.wakes += 1
        self.stats.wake_s += seconds

    async def is_sleeping(self, request: web.Request) -> web.StreamResponse:
        """True while paused at any level, 0 included (vllm/v1/engine/core.py
        ``is_sleeping``: scheduler paused or executor sleeping)."""
        self.record(request, None)
        return json_response(dumps({"is_sleeping": self.engine.is_sleeping}))

    async def collective_rpc(self, request: web.Request) -> web.StreamResponse:
        """``{"method": "reload_weights"}`` (the step of a level-2 wake between the tags);
        vLLM runs any worker method, the fake knows this one only: others answer 400.
        vLLM answers ``{"results": [...]}``, one result per worker."""
        raw = await request.read()
        try:  # vllm/entrypoints/serve/dev/rpc/api_router.py: HTTPExceptions, not validation
            body = json.loads(raw)
        except ValueError as exc:
            self.record(request, None)
            msg = f"JSON decode error: {exc}"
            return error_response(ApiError(400, msg, "Bad Request"))
        self.record(request, body)
        if not isinstance(body, dict):
            msg = "Request body must be a JSON object"
            return error_response(ApiError(400, msg, "Bad Request"))
        method = body.get("method")
        if method is None:  # vllm/entrypoints/serve/dev/rpc/api_router.py: an HTTPException
            return error_response(ApiError(400, "Missing 'method' in request body", "Bad Request"))
        if method != "reload_weights":
            return error_response(ApiError(400, f"fake vLLM: unsupported method {method!r}"))
        try:
            if "weights" not in self.engine.sleeping_tags:  # level 2: the weights from disk
                await self._modelled_wake()
            self.engine.reload_weights()
        except ValueError as exc:
            return error_response(ApiError(500, str(exc), "InternalServerError"))
        return json_response(dumps({"results": [None]}))

    async def reset_prefix_cache(self, request: web.Request) -> web.StreamResponse:
        self.record(request, None)
        return web.Response(status=200)  # the fake keeps no prefix cache
