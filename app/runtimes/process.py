"""A backend run as a local command in its own process group.

Stop sends SIGTERM to the whole group, waits `stop_grace_s`, then SIGKILLs what is left,
so a server that forks workers (vLLM does) leaves nothing behind. The command's output
is logged line by line under the backend's name.

It starts with the environment it is given: the gateway's minus every secret the
configuration names, plus its own `env:` (`app.runtimes.child_env`).

A command whose first word is `{python}` runs with the gateway's own interpreter, so the
demo's fake servers work from any shell without activating the virtualenv.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping

from app.runtimes.base import RuntimeFailure, RuntimeStatus
from app.settings import ProcessRuntimeConfig
from app.tasks import spawn

logger = logging.getLogger(__name__)

PYTHON = "{python}"


class ProcessRuntime:
    kind = "process"
    managed = True
    stop_on_shutdown = True

    def __init__(
        self, backend: str, config: ProcessRuntimeConfig, *, env: Mapping[str, str]
    ) -> None:
        """`env`: the whole environment it starts with (`app.runtimes.child_env`)."""
        self._backend = backend
        self._config = config
        self._env = dict(env)
        self._proc: asyncio.subprocess.Process | None = None
        self._log_task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            return
        command = [sys.executable if word == PYTHON else word for word in self._config.command]
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *command,
                env=self._env,
                cwd=self._config.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # own process group, so stop reaches its children
            )
        except OSError as exc:
            raise RuntimeFailure(
                f"backends.{self._backend}.runtime.command: cannot run "
                f"{self._config.command[0]!r}: {exc.strerror or exc}"
            ) from None
        logger.info("process started backend=%s pid=%d", self._backend, self._proc.pid)
        assert self._proc.stdout is not None
        self._log_task = spawn(
            self._pump_output(self._proc.stdout), name=f"process-output:{self._backend}"
        )

    async def _pump_output(self, stream: asyncio.StreamReader) -> None:
        prefix = f"[{self._backend}]"
        while line := await stream.readline():
            logger.info("%s %s", prefix, line.decode(errors="replace").rstrip())

    async def status(self) -> RuntimeStatus:
        if self._proc is None:
            return RuntimeStatus(running=False, detail="not started")
        code = self._proc.returncode
        if code is None:
            return RuntimeStatus(running=True, detail=f"pid {self._proc.pid}")
        return RuntimeStatus(running=False, exit_code=code, detail=f"exited ({code})")

    async def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            self._signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self._config.stop_grace_s)
            except TimeoutError:
                logger.warning(
                    "process ignored SIGTERM, killing backend=%s pid=%d grace_s=%g",
                    self._backend,
                    proc.pid,
                    self._config.stop_grace_s,
                )
        # Whatever is left of the group (children of an exited leader included) goes now.
        self._signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
        if self._log_task is not None:
            try:
                await asyncio.wait_for(self._log_task, 2.0)
            except TimeoutError:
                self._log_task.cancel()
        logger.info("process stopped backend=%s exit_code=%s", self._backend, proc.returncode)

    def _signal_group(self, pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # the group is already gone
            os.killpg(pgid, sig)

    def describe(self) -> str:
        return f"process {' '.join(self._config.command)!r}"
