"""Shared per-server state of the fake vLLM server: statistics, request recording and the
accounting of in-flight requests (completed / aborted / ...)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from app.sim.config import FakeConfig, Faults
from app.sim.engine import FakeEngine, Job
from app.sim.metrics import FakeMetrics
from app.sim.text import (
    ApiError,
    error_body,
    error_type_for,
    model_not_found,
    validation_error,
)
from app.sim.vram import FakeVram

# After a level-2 sleep woken without `reload_weights`, a real vLLM generates from weight
# memory that holds no weights: garbage, with a 200. The fake fails loudly instead, so a
# test sees the bad wake at once.
WEIGHTS_DISCARDED = (
    "The model weights were discarded by a level-2 sleep and not reloaded: wake with "
    'POST /wake_up?tags=weights, POST /collective_rpc {"method": "reload_weights"}, '
    "POST /wake_up?tags=kv_cache (fake vLLM; a real one would answer garbage)"
)


@dataclass
class Stats:
    """What ``GET /_fake/stats`` reports (``in_flight`` is live and never reset)."""

    requests: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=100))
    completed: int = 0
    aborted: int = 0
    failed: int = 0
    dropped: int = 0
    in_flight: int = 0
    # Modelled waits (`FakeConfig.wake_s`): how many wakes of the weights, their seconds.
    wakes: int = 0
    wake_s: float = 0.0

    def reset(self) -> None:
        self.requests.clear()
        self.completed = self.aborted = self.failed = self.dropped = 0
        self.wakes, self.wake_s = 0, 0.0


class RequestRun:
    """Progress of one admitted request, read by the accounting in ``track``."""

    __slots__ = ("arrival", "drop_after", "job", "outcome", "sent", "stall_after", "tokens")

    def __init__(self, faults: Faults, arrival: float) -> None:
        self.job = Job()
        self.arrival = arrival
        self.outcome = "abort"  # overwritten on normal completion
        self.tokens = 0
        self.sent = 0
        self.drop_after = faults.drop_after
        self.stall_after = faults.stall_after


async def forever() -> None:
    await asyncio.get_running_loop().create_future()


def error_response(err: ApiError) -> web.Response:
    return web.Response(status=err.status, body=err.body(), content_type="application/json")


def json_response(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


class FakeState:
    """Everything one fake server shares between its handlers."""

    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.models = list(config.models) or ["fake-model"]
        self.faults = config.faults()
        self.stats = Stats()
        self.listening_since: float | None = None  # time.time() when the port opened
        # time.time() when its process began (None: in a test's process); with
        # `listening_since`, the whole boot a cold start waited for.
        self.process_started: float | None = None
        self.engine = FakeEngine(config.max_num_seqs)
        self.metrics = FakeMetrics(self.models[0])
        self.vram = FakeVram(config)
        self.loras: dict[str, str] = {}  # LoRA adapters loaded at runtime: name -> path
        self._tasks: set[asyncio.Task[Any]] = set()

    def record(self, request: web.Request, body: Any, raw: bytes | None = None) -> None:
        """One request seen; `raw` (a JSON body's exact bytes, as latin-1 text) too."""
        self.stats.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": request.query_string,
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "body": body,
                "raw": None if raw is None else raw.decode("latin-1"),
            }
        )

    async def parse_body(self, request: web.Request) -> dict[str, Any]:
        """Read, record and parse a JSON object body; raises ApiError like vLLM."""
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError as exc:
            self.record(request, None, raw)
            pos = getattr(exc, "pos", 0)
            raise validation_error([pos], "json_invalid", "JSON decode error") from None
        self.record(request, body, raw)
        if body is None:
            raise validation_error([], "missing", "Field required")
        if not isinstance(body, dict):
            raise validation_error([], "model_attributes_type", "Input should be an object")
        return body

    def resolve_model(self, body: dict[str, Any]) -> str:
        """A served name or a loaded LoRA adapter's (vllm/entrypoints/serve/engine/
        serving.py ``_check_model``); the answer names the adapter, as vLLM's does."""
        model = body.get("model")
        if not model:
            return self.models[0]  # vLLM: a request without "model" uses the served model
        if not isinstance(model, str) or (model not in self.models and model not in self.loras):
            raise model_not_found(str(model), self.models)
        return model

    def injected_failure(self) -> web.Response | None:
        status = self.faults.take_failure()
        if status is None:
            return None
        self.stats.failed += 1
        message = f"Injected failure (fake vLLM fail_status={status})"
        body = error_body(status, message, error_type_for(status))
        return web.Response(status=status, body=body, content_type="application/json")

    def priority_of(self, body: dict[str, Any]) -> int:
        """The request's ``priority`` (chat, completions, embeddings, responses: vLLM's
        request models with the field), validated like vLLM: an integer (pydantic). With
        ``--scheduling-policy fcfs`` it is accepted and ignored: vLLM 0.33's input
        processor no longer checks it and ``FCFSRequestQueue`` orders by arrival only
        (vllm/v1/core/sched/request_queue.py); older vLLM answered 400."""
        value = body.get("priority", 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise validation_error(["priority"], "int_type", "Input should be a valid integer")
        return value if self.config.scheduling_policy == "priority" else 0

    async def admit(
        self,
        arrival: float,
        work: Callable[[RequestRun], Awaitable[web.StreamResponse]],
        *,
        priority: int = 0,
    ) -> web.StreamResponse:
        """A validated request: the injected failure if one is due, else ``work`` run as
        an in-flight request (``track``), queued by ``priority`` when it must wait."""
        failure = self.injected_failure()
        if failure is not None:
            return failure
        run = RequestRun(self.faults, arrival)
        run.job.priority = priority
        return await self.track(run, lambda: work(run))

    async def track(
        self, run: RequestRun, work: Callable[[], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Run ``work`` as an in-flight request; account for its outcome however it ends."""
        stats, engine, metrics = self.stats, self.engine, self.metrics
        stats.in_flight += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        admitted = False
        try:
            if self.faults.stall_before_headers:
                await forever()
            admitted = await engine.admit(run.job)
            if admitted and engine.weights_discarded:
                run.outcome = "failed"
                return error_response(ApiError(500, WEIGHTS_DISCARDED, "InternalServerError"))
            response: web.StreamResponse = await work()
            return response
        finally:
            stats.in_flight -= 1
            if task is not None:
                self._tasks.discard(task)
            if admitted:
                engine.release(run.job)
            if run.tokens:
                metrics.generation_tokens.inc(run.tokens)
            outcome = run.outcome
            if outcome == "dropped":
                stats.dropped += 1
            elif outcome == "failed":
                stats.failed += 1
            elif outcome == "abort":
                stats.aborted += 1
                metrics.request_success["abort"].inc()
            else:
                stats.completed += 1
                metrics.request_success[outcome].inc()
                metrics.e2e.observe(time.monotonic() - run.arrival)

    def first_token(self, run: RequestRun, prompt_tokens: int) -> None:
        self.metrics.prompt_tokens.inc(prompt_tokens)
        self.metrics.ttft.observe(time.monotonic() - run.arrival)

    def cancel_all(self) -> None:
        """Shutdown: end in-flight requests (stalls included) so the server stops quickly."""
        self.engine.abort_all()
        for task in list(self._tasks):
            task.cancel()


def process_started() -> float | None:
    """time.time() when this process began (Linux /proc, to the clock tick), else None."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime, since boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
