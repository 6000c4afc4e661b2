"""The fake vLLM server's GPU footprint, reported to the simulated GPU's ledger.

Real vLLM allocates its weights and then its KV cache while it loads, before ``/health``
answers, so the footprint (``--vram-mib``) is reported when loading begins, not when the
port opens. Sleeping at level 1 or 2 frees the weights and the KV cache (identical GPU
memory for both levels); what stays is the CUDA context, CUDA graphs and allocator
leftovers, measured at 0.5-6 GiB, hence ``--vram-asleep-mib`` (default one eighth of
``--vram-mib``). The footprint follows the engine: asleep while any tag sleeps, awake again
after a full wake-up; level 0 only pauses scheduling and frees nothing. A heartbeat
rewrites the entry every second; clean shutdown removes it.

``--sleep-leak-mib N`` models vLLM's leak over sleep/wake cycles (vLLM #21336): each full
wake-up leaves N MiB more held by the next sleep (never more than ``--vram-mib``); the
awake footprint stays the same. A new server (a cold start) begins again without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from app.gpu.ledger import LedgerWriter
from app.sim.config import FakeConfig

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0


class FakeVram:
    """Footprint state of one fake server; a no-op without a ledger directory or with a
    zero footprint."""

    def __init__(self, config: FakeConfig) -> None:
        self.awake_mib = config.vram_mib
        self.base_asleep_mib = asleep_mib(config)
        self.leak_mib = config.sleep_leak_mib
        self.cycles = 0  # full wake-ups after a sleep (sleep/wake cycles) of this server
        self.gpus = tuple(config.gpus)
        self.directory = Path(config.sim_gpu_dir) if config.sim_gpu_dir else None
        self.model = config.models[0] if config.models else "fake-model"
        self.sleeping = False
        self.held_mib = 0  # what this server holds now (0 before loading, after shutdown)
        self._writer: LedgerWriter | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._started = False
        self._stopped = False

    @property
    def asleep_mib(self) -> int:
        """What a sleep holds now: the residue, and the leak of the cycles so far."""
        return min(self.awake_mib, self.base_asleep_mib + self.cycles * self.leak_mib)

    @property
    def enabled(self) -> bool:
        return self.directory is not None and self.awake_mib > 0

    @property
    def ledger_file(self) -> str | None:
        return str(self._writer.path) if self._writer is not None else None

    def start(self, port: int | None) -> None:
        """Loading begins: hold the awake footprint and report it (idempotent). Raises
        OSError if the ledger cannot be written. Needs a running event loop."""
        if self._started or self._stopped:
            return
        self._started = True
        self.held_mib = self.asleep_mib if self.sleeping else self.awake_mib
        if not self.enabled:
            return
        assert self.directory is not None
        writer = LedgerWriter(
            self.directory, pid=os.getpid(), gpus=self.gpus, model=self.model, port=port
        )
        writer.set_mib(self.held_mib)
        self._writer = writer
        task = asyncio.get_running_loop().create_task(self._beat(writer), name="fake-vram-beat")
        task.add_done_callback(_log_crash)
        self._heartbeat = task

    def follow(self, sleeping: bool) -> None:
        """The engine's sleep state changed (call after each /sleep and /wake_up)."""
        if sleeping == self.sleeping:
            return
        self.sleeping = sleeping
        if not sleeping:
            self.cycles += 1
        if not self._started or self._stopped:
            return
        self.held_mib = self.asleep_mib if sleeping else self.awake_mib
        if self._writer is not None:
            try:
                self._writer.set_mib(self.held_mib)
            except OSError as exc:
                log.warning("sim ledger write failed file=%s error=%s", self._writer.path, exc)

    async def stop(self) -> None:
        """Shutdown: stop the heartbeat, remove the entry (idempotent)."""
        self._stopped = True
        self.held_mib = 0
        task, self._heartbeat = self._heartbeat, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._writer is not None:
            self._writer.remove()

    async def _beat(self, writer: LedgerWriter) -> None:
        failing = False
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                writer.heartbeat()
            except OSError as exc:
                if not failing:
                    log.warning("sim ledger heartbeat failed file=%s error=%s", writer.path, exc)
                failing = True
            else:
                failing = False


def asleep_mib(config: FakeConfig) -> int:
    """The footprint while asleep: ``vram_asleep_mib``, default one eighth of ``vram_mib``."""
    if config.vram_asleep_mib is not None:
        return config.vram_asleep_mib
    return config.vram_mib // 8


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("fake vram heartbeat crashed", exc_info=task.exception())
