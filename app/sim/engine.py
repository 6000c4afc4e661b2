"""Scheduler and sleep state of the fake vLLM server.

The engine models what a client of vLLM can observe: at most ``max_num_seqs`` requests run,
the rest wait; a sleeping (paused) engine accepts requests but does not schedule them until
``wake_up``; ``sleep`` with mode ``abort`` (vLLM's default) finishes in-flight requests with
finish_reason ``abort``, ``wait`` drains them first, ``keep`` freezes them until wake-up
(vLLM ``EngineCore.pause_scheduler``/``sleep``).

Level 2 discards the weights (level 1 offloads them to host RAM): waking the ``weights``
tag gives their memory back but not their contents, so ``weights_discarded`` stays set
until ``reload_weights`` (vLLM's ``collective_rpc`` method) runs on awake weights. The
server fails generation while it is set (see ``FakeState.track``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Literal

PauseMode = Literal["abort", "wait", "keep"]
SLEEP_TAGS = frozenset({"weights", "kv_cache"})


class Job:
    """One generation/embedding request inside the engine."""

    __slots__ = ("_admission", "aborted", "priority", "waiter")

    def __init__(self) -> None:
        self.aborted = False
        self.priority = 0  # lower starts first (always 0 without priority scheduling)
        self.waiter: asyncio.Future[None] | None = None
        self._admission: asyncio.Future[bool] | None = None

    def abort(self) -> None:
        self.aborted = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class FakeEngine:
    """Admission (running/waiting), sleep/wake and abortable waits."""

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max(1, max_num_seqs)
        self.running = 0
        self.waiting = 0
        self.pause: Literal["none", "new", "all"] = "none"
        self.sleep_level = 0
        self.sleeping_tags: set[str] = set()
        self.weights_discarded = False  # a level-2 sleep, no reload_weights since
        self._jobs: set[Job] = set()
        self._queue: deque[Job] = deque()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def memory_sleeping(self) -> bool:
        """Some memory (weights, KV cache) sleeps: a level 1 or 2 sleep not fully woken."""
        return bool(self.sleeping_tags)

    @property
    def is_sleeping(self) -> bool:
        """vllm/v1/engine/core.py ``is_sleeping``: the scheduler is paused (any level, 0
        included) or some memory sleeps."""
        return self.pause != "none" or bool(self.sleeping_tags)

    # --- admission ---------------------------------------------------------------------------

    async def admit(self, job: Job) -> bool:
        """Wait for a running slot; False if the job was aborted while waiting."""
        if self.pause == "none" and self.running < self.max_num_seqs and not self._queue:
            self._start(job)
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        job._admission = fut
        # By priority, then arrival: vLLM's priority policy (fcfs: every priority is 0).
        ahead = sum(1 for queued in self._queue if queued.priority <= job.priority)
        self._queue.insert(ahead, job)
        self.waiting += 1
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                if job in self._queue:
                    self._queue.remove(job)
                    self.waiting -= 1
            elif fut.result():
                self.release(job)
            raise

    def _start(self, job: Job) -> None:
        self.running += 1
        self._jobs.add(job)
        self._idle.clear()

    def release(self, job: Job) -> None:
        """A running job finished (any outcome)."""
        if job in self._jobs:
            self._jobs.discard(job)
            self.running -= 1
            if self.running == 0:
                self._idle.set()
            self._dispatch()

    def _dispatch(self) -> None:
        while self._queue and self.pause == "none" and self.running < self.max_num_seqs:
            job = self._queue.popleft()
            self.waiting -= 1
            assert job._admission is not None
            if not job._admission.cancelled():
                self._start(job)
                job._admission.set_result(True)

    # --- waiting inside a request ------------------------------------------------------------

    async def wait_until(self, job: Job, deadline: float) -> None:
        """Sleep until loop time ``deadline`` (returns early if aborted), then hold while
        the engine is paused with mode ``keep``."""
        loop = asyncio.get_running_loop()
        if not job.aborted and deadline > loop.time():
            fut: asyncio.Future[None] = loop.create_future()
            job.waiter = fut
            handle = loop.call_at(deadline, _wake, fut)
            try:
                await fut
            finally:
                handle.cancel()
                job.waiter = None
        while self.pause == "all" and not job.aborted:
            await self._resumed.wait()

    # --- sleep mode --------------------------------------------------------------------------

    def _set_pause(self, pause: Literal["none", "new", "all"]) -> None:
        self.pause = pause
        if pause == "all":
            self._resumed.clear()
        else:
            self._resumed.set()

    async def sleep(self, level: int, mode: PauseMode) -> None:
        if mode == "abort":
            self._set_pause("new")
            for job in list(self._jobs):
                job.abort()
            while self._queue:
                job = self._queue.popleft()
                self.waiting -= 1
                job.aborted = True
                assert job._admission is not None
                if not job._admission.cancelled():
                    job._admission.set_result(False)
        elif mode == "wait":
            self._set_pause("new")
            await self._idle.wait()
        else:
            self._set_pause("all")
        if level == 2 and "weights" not in self.sleeping_tags:
            self.weights_discarded = True  # asleep already: sleeping a tag again is a no-op
        if level >= 1:
            self.sleep_level = level
            self.sleeping_tags = set(SLEEP_TAGS)

    def wake_up(self, tags: list[str] | None) -> bool:
        """vllm/v1/engine/core.py ``wake_up``: wake ``tags`` (None: all; ``scheduling`` is
        the level-0 tag and wakes no memory); scheduling resumes only once no memory
        sleeps. True when fully awake."""
        if tags is None:
            self.sleeping_tags.clear()
        else:
            self.sleeping_tags.difference_update(tags)
        if self.sleeping_tags:
            return False
        self.sleep_level = 0
        self._set_pause("none")
        self._dispatch()
        return True

    def reload_weights(self) -> None:
        """``collective_rpc`` ``reload_weights``: load the weights from disk again. Raises
        ValueError while the weights tag sleeps (there is no memory to load them into)."""
        if "weights" in self.sleeping_tags:
            raise ValueError("reload_weights while the weights sleep: wake_up tags=weights first")
        self.weights_discarded = False

    def abort_all(self) -> None:
        """Used at shutdown."""
        for job in list(self._jobs):
            job.abort()
