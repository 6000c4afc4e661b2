"""Configuration and shared per-server state of the fake vLLM server: faults, statistics,
request recording and the accounting of in-flight requests (completed / aborted / ...)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from aiohttp import web

from app.sim.fake_engine import FakeEngine, Job
from app.sim.fake_metrics import FakeMetrics
from app.sim.fake_text import (
    ApiError,
    error_body,
    error_type_for,
    model_not_found,
    validation_error,
)
from app.sim.fake_vram import FakeVram


@dataclass
class FakeConfig:
    """All options of the fake server (CLI flags map 1:1, dashes to underscores)."""

    host: str = "127.0.0.1"
    port: int = 8000
    models: list[str] = field(default_factory=lambda: ["fake-model"])
    startup_delay: float = 0.0
    ttft: float = 0.0
    tokens_per_second: float = 0.0
    max_tokens: int = 16
    max_model_len: int = 8192
    max_num_seqs: int = 256
    embedding_dim: int = 8
    fail_status: int | None = None
    fail_count: int | None = None
    drop_after: int | None = None
    stall_after: int | None = None
    stall_before_headers: bool = False
    health_status: int | None = None
    ignore_sigterm: bool = False
    dev_mode: bool | None = None  # None: read VLLM_SERVER_DEV_MODE when the app is built
    version: str = "0.0.0-fake"
    # GPU footprint reported to the simulated GPU's ledger (app.sim.fake_vram)
    vram_mib: int = 0  # while awake; 0 reports nothing
    vram_asleep_mib: int | None = None  # while asleep (level 1 or 2); None: vram_mib // 8
    sim_gpu_dir: str | None = None  # the ledger directory; None reports nothing
    gpus: list[int] = field(default_factory=lambda: [0])

    def faults(self) -> Faults:
        return Faults(**{f.name: getattr(self, f.name) for f in fields(Faults)})


@dataclass
class Faults:
    """Runtime-adjustable behaviour; ``POST /_fake/faults`` patches it (null = default)."""

    fail_status: int | None = None
    fail_count: int | None = None
    drop_after: int | None = None
    stall_after: int | None = None
    stall_before_headers: bool = False
    ttft: float = 0.0
    tokens_per_second: float = 0.0
    health_status: int | None = None

    def take_failure(self) -> int | None:
        """Status to fail the next generation/embedding request with, consuming fail_count."""
        status = self.fail_status
        if status is None or self.fail_count is None:
            return status
        if self.fail_count <= 0:
            return None
        self.fail_count -= 1
        if self.fail_count == 0:
            self.fail_status = self.fail_count = None
        return status

    def update(self, patch: dict[str, Any]) -> None:
        """Validate all of ``patch`` first, then apply it; raises ValueError."""
        defaults = {f.name: f.default for f in fields(self)}
        new: dict[str, Any] = {}
        for key, value in patch.items():
            if key not in defaults:
                raise ValueError(f"unknown fault option {key!r}")
            if value is None:
                new[key] = defaults[key]
            elif key == "stall_before_headers":
                if not isinstance(value, bool):
                    raise ValueError("stall_before_headers must be a boolean")
                new[key] = value
            elif key in ("ttft", "tokens_per_second"):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ValueError(f"{key} must be a number")
                if not math.isfinite(value) or value < 0:
                    raise ValueError(f"{key} must be >= 0")
                new[key] = float(value)
            else:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{key} must be a non-negative integer")
                if key in ("fail_status", "health_status") and not 100 <= value <= 599:
                    raise ValueError(f"{key} must be an HTTP status code")
                new[key] = value
        for key, value in new.items():
            setattr(self, key, value)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Stats:
    """What ``GET /_fake/stats`` reports (``in_flight`` is live and never reset)."""

    requests: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=100))
    completed: int = 0
    aborted: int = 0
    failed: int = 0
    dropped: int = 0
    in_flight: int = 0

    def reset(self) -> None:
        self.requests.clear()
        self.completed = self.aborted = self.failed = self.dropped = 0


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
        self.engine = FakeEngine(config.max_num_seqs)
        self.metrics = FakeMetrics(self.models[0])
        self.vram = FakeVram(config)
        self._tasks: set[asyncio.Task[Any]] = set()

    def record(self, request: web.Request, body: Any) -> None:
        self.stats.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": request.query_string,
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "body": body,
            }
        )

    async def parse_body(self, request: web.Request) -> dict[str, Any]:
        """Read, record and parse a JSON object body; raises ApiError like vLLM."""
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError as exc:
            self.record(request, None)
            pos = getattr(exc, "pos", 0)
            raise validation_error([pos], "json_invalid", "JSON decode error") from None
        self.record(request, body)
        if body is None:
            raise validation_error([], "missing", "Field required")
        if not isinstance(body, dict):
            raise validation_error([], "model_attributes_type", "Input should be an object")
        return body

    def resolve_model(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        if model is None:
            return self.models[0]  # vLLM: a request without "model" uses the served model
        if not isinstance(model, str) or model not in self.models:
            raise model_not_found(str(model))
        return model

    def injected_failure(self) -> web.Response | None:
        status = self.faults.take_failure()
        if status is None:
            return None
        self.stats.failed += 1
        message = f"Injected failure (fake vLLM fail_status={status})"
        body = error_body(status, message, error_type_for(status))
        return web.Response(status=status, body=body, content_type="application/json")

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
