"""A backend's server as its lifecycle drives it: the runtime that runs it (start, stop,
status) and the vLLM in it (health, sleep mode), with what was last seen of its health.

All the I/O of a backend's lifecycle happens here; `Backend` decides when, under its
lock, and owns the state. Nothing here changes a backend's state: failures are raised
(`StartFailed`, `RuntimeFailure`) or returned for the backend to act on.

While a start it launched waits for health, it reads the server's output (a runtime that
offers it: `app.runtimes.output.OutputSource`) for vLLM's start-up phases (`load`) and
keeps the last `RECENT_LINES`; a start that fails quotes the decisive ones
(`app.upstreams.vllm_output.explain`: recognised lines only, bounded, with a hint) and
names the command that shows the rest (`microscheduler logs NAME`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Final

from app.errors import PORT_IN_USE_REASON
from app.lifecycle.load import WAITING_FOR_VRAM
from app.lifecycle.metrics import LifecycleMetrics
from app.lifecycle.served import Served
from app.lifecycle.sleep_guard import GuardCause, wake_cause
from app.lifecycle.state import SleepOutcome, StopReason
from app.runtimes.base import Runtime, RuntimeFailure, RuntimeStatus
from app.runtimes.output import OutputSource
from app.tasks import cancel_and_wait, spawn
from app.upstreams.vllm import ControlError, ControlTimeout, SleepUnsupported, VllmClient
from app.upstreams.vllm_learned import not_ours
from app.upstreams.vllm_output import CompileSeen, LoadProgress, LoadTracker, explain

logger = logging.getLogger(__name__)

READINESS_POLL_S: Final = 0.05  # /health while starting: a refused connection is cheap
# Whether the server still runs, while starting: a Docker inspect through the proxy each
# time, so not at every health poll.
STATUS_POLL_S: Final = 0.5
RECENT_LINES: Final = 200  # of a start's output, kept to explain its failure
OUTPUT_GRACE_S: Final = 2.0  # after its exit, for the rest of its output to be read


@dataclass(frozen=True, slots=True)
class Found:
    """A server found at gateway start: running, asleep, on which GPUs (None: not known)."""

    running: bool
    asleep: bool = False
    gpus: tuple[int, ...] | None = None


class StartFailed(Exception):
    """The server was launched (or woken) but did not become ready; the message says why."""


class WakeFailed(StartFailed):
    """A wake from sleep failed (`timed_out`: did not answer within the control timeout);
    the server was stopped."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class NotOurServer(StartFailed):
    """The server that answered the start lists other models than the backend's: another
    server answers on its port (ours was stopped)."""


def wake_failure(exc: StartFailed) -> GuardCause | None:
    """What a wake that failed with `exc` trips in the sleep guard (its server was stopped,
    or died): `wake_timeout` or `wake_failed`; None for another server on its port."""
    timed_out = isinstance(exc, WakeFailed) and exc.timed_out
    return wake_cause(timed_out=timed_out, not_ours=isinstance(exc, NotOurServer))


class Server:
    def __init__(
        self,
        name: str,
        runtime: Runtime,
        vllm: VllmClient,
        metrics: LifecycleMetrics,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        """`on_progress`: called when the load progress of a start changes."""
        self.name = name
        self.runtime = runtime
        self.vllm = vllm
        self.healthy: bool | None = None  # last health check; None before the first
        self.health_error: str | None = None
        # While a start waits: False once a health check found nobody listening yet.
        self._listening: bool | None = None
        self.runtime_detail: str | None = None  # the runtime's last word on it
        # While wait_healthy polls: when it began and what the runtime last said.
        self._waiting: tuple[float, str] | None = None
        self._learning_since: float | None = None  # healthy, asked what it serves since
        # While admission waits for memory other models hold: says what it waits for.
        self._vram_wait: Callable[[], str] | None = None
        self._vram_wait_phase = WAITING_FOR_VRAM
        self._vram_waited_s = 0.0  # how long such waits took, in all (ended ones)
        self._vram_wait_began: float | None = None
        # The start being watched: its progress and last lines, and the task reading them.
        self._tracker: LoadTracker | None = None
        self._recent: deque[str] = deque(maxlen=RECENT_LINES)
        self._reader: asyncio.Task[None] | None = None
        self._on_progress = on_progress
        # What vLLM said its weights took on one GPU at its last load (GiB; None: not said).
        self.loaded_weights_gib: float | None = None
        # The torch.compile of its last start that logged one (kept after it is ready).
        self.compiled = CompileSeen()
        self._up_gauge = metrics.backend_up.labels(name)
        self._sleeps = metrics.backend_sleeps

    async def check_health(self, *, starting: bool = False) -> bool:
        """One health check; records the outcome (and logs a change). Never raises.

        `starting`: a start waits for its server, which opens its port late (vLLM, after
        loading): a refused connection then is progress, "waiting for the server to
        listen" in `start_progress`, not a `health_error` (nor a warning in the log)."""
        error = await self.vllm.health()
        ok = error is None
        if starting and error is not None and not_listening(error):
            self._listening = False
            if self.healthy is not False:
                logger.info("backend waiting for its server to listen backend=%s url=%s",
                            self.name, self.vllm.health_url)  # fmt: skip
            self.healthy, self.health_error = False, None
            self._up_gauge.set(0)
            return False
        self._listening = None
        if ok != self.healthy:
            log = logger.info if ok else logger.warning
            log("backend health backend=%s healthy=%s error=%s", self.name, ok, error)
        self.healthy, self.health_error = ok, error
        self._up_gauge.set(1 if ok else 0)
        return ok

    async def learn(self, model_ids: list[str], served: Served, *, ours: str | None = None) -> bool:
        """Ask the ready server what it serves and its `max_model_len`, into `served`;
        False when it did not answer (what was known stays).

        `ours`: at a start, the model id our server serves (`models[0]`). A server whose
        `/v1/models` lists others is not ours but another answering on its port (its
        health check passed for ours): ours is stopped and `NotOurServer` raised, the
        one exception."""
        self._learning_since = time.monotonic()
        try:
            answer = await self.vllm.learn(model_ids)
        finally:
            self._learning_since = None
        if answer is None:
            return False
        if ours is not None and (listed := not_ours(answer.models, ours)) is not None:
            await self._not_ours(ours, listed)
        served.take(answer.learned)
        return True

    async def _not_ours(self, model: str, listed: str) -> None:
        why = (
            f"{PORT_IN_USE_REASON}the server at {self.vllm.base_url} lists {listed} in /v1/models, "
            f"not {model!r} (backends.{self.name}.models[0]): another server answers on its "
            "port, or ours serves the model under another name (--served-model-name)"
        )
        logger.error("not our server, stopping ours backend=%s url=%s lists=%s", self.name,
                     self.vllm.base_url, listed)  # fmt: skip
        try:
            await self.runtime.stop()
        except RuntimeFailure as exc:
            raise NotOurServer(f"{why}; stopping ours failed: {exc}") from None
        raise NotOurServer(f"{why}; stopped ours")

    async def exited(self) -> RuntimeStatus | None:
        """The runtime's status when the server has exited; None while it runs or when the
        runtime cannot be asked (then `runtime_detail` says so)."""
        try:
            status = await self.runtime.status()
        except RuntimeFailure as exc:
            self.runtime_detail = f"unknown: {exc}"
            return None
        self.runtime_detail = status.detail
        return None if status.running else status

    async def launch(
        self, *, wake: bool, level: int | None = None, gpus: tuple[int, ...] = (0,)
    ) -> None:
        """Start the server on `gpus`, or wake it from sleep mode at `level` (None: not
        known; see `VllmClient.wake_up`). Raises `RuntimeFailure` or `StartFailed`."""
        if not wake:
            await self.runtime.start(gpus)
            await self._watch_output()
            return
        try:
            await self.vllm.wake_up(level=level)
        except ControlError as exc:
            # Half awake is no state to serve from: stop it, the next start is a clean one.
            logger.error("wake from sleep failed, stopping backend=%s error=%s", self.name, exc)
            await self.runtime.stop()
            timed_out = isinstance(exc, ControlTimeout)
            raise WakeFailed(f"wake from sleep failed ({exc})", timed_out=timed_out) from None

    async def _watch_output(self) -> None:
        await cancel_and_wait(self._reader)
        self._recent.clear()
        self._tracker = LoadTracker()
        if isinstance(self.runtime, OutputSource):
            reader = self._read_output(self.runtime, self._tracker)
            self._reader = spawn(reader, name=f"start-output:{self.name}")

    async def _read_output(self, source: OutputSource, tracker: LoadTracker) -> None:
        try:
            async for line in source.run_output():
                self._recent.append(line)
                if tracker.feed(line) and self._on_progress is not None:
                    self._on_progress()
                if tracker.weights_gib is not None:
                    self.loaded_weights_gib = tracker.weights_gib
                if tracker.compile != CompileSeen():
                    self.compiled = tracker.compile
        except RuntimeFailure as exc:
            logger.info("cannot read its output while starting backend=%s error=%s",
                        self.name, exc)  # fmt: skip

    @property
    def load(self) -> LoadProgress | None:
        """The progress of the start it watches, with its torch.compile so far (None when
        it watches none)."""
        tracker = self._tracker
        return None if tracker is None else replace(tracker.progress, compile=tracker.compile)

    async def end_watch(self) -> None:
        """The start is over (ready, failed or cancelled): stop reading its output."""
        await cancel_and_wait(self._reader)
        self._reader = self._tracker = None

    async def _explanation(self) -> str:
        """What its output says about a failed start (after waiting up to
        `OUTPUT_GRACE_S` for the reader to reach the end of an exited server's output),
        then where to read the whole of it, for a runtime whose output the gateway reads:
        `; it said: "..." (hint: ...) (its output: `microscheduler logs NAME`)`."""
        if not isinstance(self.runtime, OutputSource):
            return ""
        reader = self._reader
        if reader is not None and not reader.done():
            await asyncio.wait({reader}, timeout=OUTPUT_GRACE_S)
        return f"{explain(self._recent)} (its output: `microscheduler logs {self.name}`)"

    async def wait_healthy(self, start_timeout_s: float) -> None:
        """Poll the health check until it passes; fail at once if the server exits.

        A refused connection means still loading (vLLM opens its port late). When the
        runtime cannot be asked (Docker proxy down) the health check alone decides.
        A pass counts only with the runtime's word, asked in the same round, that our
        server still runs: another server on its port would answer for one that died.
        """
        began = time.monotonic()
        deadline = began + start_timeout_s
        next_status = 0.0
        running = "the runtime has not answered yet"
        runtime_ready: bool | None = None  # False: the runtime knows it is not ready yet
        owner_stopped = False  # its owner keeps it stopped (running = what it waits for)
        try:
            while True:
                asked = time.monotonic() >= next_status  # the runtime, this round
                if asked:
                    next_status = time.monotonic() + STATUS_POLL_S
                    try:
                        status = await self.runtime.status()
                    except RuntimeFailure as exc:
                        logger.warning("runtime status unknown backend=%s error=%s", self.name, exc)
                        running = f"its runtime cannot be asked ({exc})"
                        runtime_ready, owner_stopped = None, False
                    else:
                        self.runtime_detail = status.detail
                        if not status.running and not status.stopped_by_owner:
                            code, more = exit_text(status)
                            why = await self._explanation()
                            raise StartFailed(f"exited with {code} before it was ready{more}{why}")
                        # Stopped by its owner: wait for the owner to run it again.
                        owner_stopped = not status.running
                        runtime_ready = False if owner_stopped else status.ready
                        running = (
                            status.detail
                            if status.ready is not None or owner_stopped
                            else f"the {self._what_runs()} is running"
                        )
                if await self.check_health(starting=True) and runtime_ready is not False:
                    if asked:
                        return
                    next_status = 0.0  # confirm, at once, that it is ours that runs
                    continue
                self._waiting = (began, running)
                if time.monotonic() >= deadline:
                    await self.runtime.stop()
                    if owner_stopped:  # nothing of its own to stop: say what it waited for
                        raise StartFailed(
                            f"not ready {start_timeout_s:g}s after start (start_timeout_s), "
                            f"still {running}"
                        )
                    raise StartFailed(
                        f"not healthy {start_timeout_s:g}s after start (start_timeout_s); "
                        f"stopped it{await self._explanation()}"
                    )
                await asyncio.sleep(READINESS_POLL_S)
        finally:
            self._waiting = None
            self._listening = None

    def _what_runs(self) -> str:
        return "container" if self.runtime.kind == "docker" else "process"

    @property
    def start_progress(self) -> str | None:
        """While a start waits for health: `waiting for the server to listen on
        http://127.0.0.1:8189/health (refused for 40 s); the process is running` (for
        /status, the page, wake notices)."""
        if self._vram_wait is not None:
            return self._vram_wait()
        if self._learning_since is not None:  # healthy; vLLM builds its schema (0.6-3 s)
            waited = int(time.monotonic() - self._learning_since)
            return (
                f"health check to {self.vllm.health_url} passes; asking what it serves "
                f"(/openapi.json, /v1/models) for {waited} s"
            )
        if self._waiting is None:
            return None
        began, running = self._waiting
        if self.healthy:  # the runtime says not ready yet (no ready endpoint)
            waited = int(time.monotonic() - began)
            return f"health check to {self.vllm.health_url} passes; waited {waited} s: {running}"
        waited = int(time.monotonic() - began)
        if self._listening is False:  # a refused connection: still loading, port closed
            return (
                f"waiting for the server to listen on {self.vllm.health_url} "
                f"(refused for {waited} s); {running}"
            )
        error = self.health_error or "failing"
        return f"health check to {self.vllm.health_url} {error} for {waited} s; {running}"

    @property
    def vram_wait_phase(self) -> str | None:
        """While admission waits before the launch: the load phase that says so."""
        return None if self._vram_wait is None else self._vram_wait_phase

    @contextlib.contextmanager
    def waiting_for_vram(
        self, progress: Callable[[], str], phase: str = WAITING_FOR_VRAM
    ) -> Iterator[None]:
        """Admission waits before the launch, for memory other models hold or (`phase`
        `WAITING_FOR_TURN`) for its turn on its GPUs: `start_progress` is `progress()`."""
        self._vram_wait, self._vram_wait_phase = progress, phase
        self._vram_wait_began = began = time.monotonic()
        try:
            yield
        finally:
            self._vram_wait = self._vram_wait_began = None
            self._vram_waited_s += time.monotonic() - began

    @property
    def vram_waited_s(self) -> float:
        """Seconds its starts have waited for memory other models hold, in all (the wait
        under way included): a request held for the start counts its share as `yield`."""
        began = self._vram_wait_began
        return self._vram_waited_s + (0.0 if began is None else time.monotonic() - began)

    async def stop(self) -> None:
        """Stop a server the gateway manages (nothing for an external one)."""
        if self.runtime.managed:
            await self.runtime.stop()

    async def sleep(self, level: int, reason: StopReason) -> SleepOutcome:
        """`POST /sleep`; `SLEPT`, or why it must be stopped instead (logged and counted
        with `reason`: idle, eviction, yield, admin)."""
        try:
            await self.vllm.sleep(level)
        except SleepUnsupported as exc:
            logger.warning("sleep mode not offered, stopping instead backend=%s reason=%s "
                           "why=%s", self.name, reason, exc)  # fmt: skip
            outcome = SleepOutcome.STOPPED
        except ControlError as exc:
            logger.error("sleep failed, stopping instead backend=%s reason=%s error=%s",
                         self.name, reason, exc)  # fmt: skip
            outcome = SleepOutcome.FAILED
        else:
            outcome = SleepOutcome.SLEPT
        self._sleeps.labels(self.name, outcome, reason).inc()
        return outcome

    async def found_running(self, *, may_sleep: bool) -> Found:
        """At gateway start: whether a server that may have outlived an earlier gateway
        runs, asleep or not, and where. Asleep is only asked when it `may_sleep`; unknown
        counts as not running."""
        try:
            status = await self.runtime.status()
        except RuntimeFailure as exc:
            logger.warning("cannot tell whether it runs backend=%s error=%s", self.name, exc)
            return Found(running=False)
        if not status.running:
            return Found(running=False)
        logger.info("adopting running server backend=%s detail=%s", self.name, status.detail)
        if not may_sleep:
            return Found(running=True, gpus=status.gpus)
        try:
            asleep = await self.vllm.is_sleeping()
        except ControlError:
            asleep = False  # no sleep mode, or not answering yet: treat it as awake
        return Found(running=True, asleep=asleep, gpus=status.gpus)

    async def asleep_level(self) -> int | None:
        """At gateway start, for a server found asleep: the level it sleeps at, as its
        `/metrics` says (None: not known). Never raises."""
        level = await self.vllm.asleep_level()
        logger.info("found asleep backend=%s level=%s", self.name,
                    "unknown" if level is None else level)  # fmt: skip
        return level


def exit_text(status: RuntimeStatus) -> tuple[str, str]:
    """("code 137", ", OOM-killed: ...") from a status like "exited (137), OOM-killed: ..."."""
    code = "no exit code" if status.exit_code is None else f"code {status.exit_code}"
    prefix = f"exited ({status.exit_code})"
    if status.detail.startswith(prefix):
        return code, status.detail[len(prefix) :]
    return code, f" ({status.detail})" if status.detail else ""


def not_listening(error: str) -> bool:
    """Whether a failed health check (`VllmClient.health`'s words) found nothing listening:
    httpx's `ConnectError` (`All connection attempts failed`, `[Errno 111] Connection
    refused`)."""
    lowered = error.lower()
    return lowered.startswith("connecterror") or "connection refused" in lowered
