"""A backend run as a local command in its own process group.

Stop sends SIGTERM to the whole group, waits `stop_grace_s`, then SIGKILLs what is left,
so a server that forks workers (vLLM does) leaves nothing behind.

Its stdout and stderr go to a pipe read by a relay (`app.runtimes.output_relay`, a small
Python process in a session of its own, started beside it), which writes them to one file
in the state directory (`logs/NAME.log`, mode 0600: it may hold prompts), capped as it
writes (rotated to `NAME.log.1` before it passes `output.FILE_MAX_BYTES`), dropping lines
above a rate and saying so in the file. The relay does not end with the gateway: when the
gateway crashes the server keeps writing, and the next gateway, adopting it, reads the same
file on; it ends when the server (and whatever holds its stdout) has exited. The gateway
reads the file every `TAIL_POLL_S`, in a thread and at most `output.READ_BYTES` at a time,
into an in-memory ring (`app.runtimes.output`) that serves `GET /backends/NAME/logs` and
the load progress; what the relay dropped and the reader skipped is counted
(`OutputCounts`: the backend's metrics).

It starts with the environment it is given: the gateway's minus every secret the
configuration names, plus its own `env:` (`app.runtimes.child_env`).

Each process it starts is recorded in the state directory (`app.runtimes.process_record`)
and the record removed when it stops. After a crash of the gateway the servers keep
running: at the next start `sweep_orphans` stops those the configuration no longer
wants, and each runtime adopts its own (found by `status()` at bring-up), which is then
watched, stopped and idle-stopped like a child. Not being its parent, the gateway cannot
wait for it: it polls /proc until the process is gone.

Before it launches a server, its port must be free: when something already answers there
(`app.runtimes.port_check`) the start is refused (`PortInUse`) rather than "ready" on
another server's health check, unless that something is the server an earlier gateway
recorded, which is adopted.

A command whose first word is `{python}` runs with the gateway's own interpreter, so the
demo's fake servers work from any shell without activating the virtualenv.

The relay and the server are spawned off the event loop (`app.runtimes.child`): uvloop's
own spawn forks the whole gateway on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final, Protocol

from app.runtimes.base import RuntimeFailure, RuntimeStatus
from app.runtimes.child import Child, start_child
from app.runtimes.output import FILE_MAX_BYTES, OutputFile, OutputRead, OutputRing
from app.runtimes.port_check import PortInUse, port_in_use_message, taken
from app.runtimes.process_record import (
    ProcessRecord,
    RecordBook,
    Verdict,
    observe,
    same_process,
    verdict,
)
from app.settings import ProcessRuntimeConfig
from app.settings.placement import child_gpus_env
from app.tasks import spawn

logger = logging.getLogger(__name__)

PYTHON = "{python}"
EXIT_POLL_S: Final = 0.1  # an adopted process (not our child): how often to look for its exit
KILL_WAIT_S: Final = 10.0  # after SIGKILL, how long it may take to disappear
TAIL_POLL_S: Final = 0.1  # how often its output file is read while it runs
RELAY_END_S: Final = 1.0  # after the server's exit, for the relay to write its last output
# The package's parent: `python -m app.runtimes.output_relay` finds `app` from there,
# installed or not.
PACKAGE_ROOT: Final = Path(__file__).resolve().parents[2]


class OutputCounts(Protocol):
    """Where a backend's lost output is counted (its metrics)."""

    def dropped_lines(self, n: int) -> None:
        """Lines the relay dropped: the server wrote faster than its budget."""

    def skipped_bytes(self, n: int) -> None:
        """Bytes the gateway did not read: it was too far behind (or cut an uncapped file)."""


class NoCounts:
    def dropped_lines(self, n: int) -> None:
        pass

    def skipped_bytes(self, n: int) -> None:
        pass


class ProcessRuntime:
    kind = "process"
    managed = True
    stop_on_shutdown = True

    def __init__(
        self,
        backend: str,
        config: ProcessRuntimeConfig,
        *,
        env: Mapping[str, str],
        book: RecordBook,
        launch: str,
        output_dir: Path,
        port: int | None = None,
        address: tuple[str, int] | None = None,
        counts: OutputCounts | None = None,
    ) -> None:
        """`env`: the whole environment it starts with (`app.runtimes.child_env`);
        `book`: where started processes are recorded; `launch`: the hash of the backend's
        launch settings (`process_record.launch_hash`); `output_dir`: where its output
        file is (`STATE_DIR/logs`); `port`: its server's, recorded; `address`: (host,
        port) of its URL, which must not answer before a launch (`port_check`); `counts`:
        where its lost output is counted."""
        self._backend = backend
        self._config = config
        self._env = dict(env)
        self._book = book
        self._launch = launch
        self._port = port
        self._address = address
        self._proc: Child | None = None
        self._adopted: ProcessRecord | None = None  # a server an earlier gateway started
        self._output = OutputFile(output_dir / f"{backend}.log")
        self._ring = OutputRing()
        self._tail_task: asyncio.Task[None] | None = None
        self._relay: Child | None = None
        self._counts: OutputCounts = counts if counts is not None else NoCounts()

    @property
    def pid(self) -> int | None:
        if self._adopted is not None:
            return self._adopted.pid
        return self._proc.pid if self._proc is not None else None

    async def start(self, gpus: tuple[int, ...] = (0,)) -> None:
        if self._proc is not None and self._proc.returncode is None:
            return
        if self._adopted is not None and same_process(self._adopted, observe(self._adopted.pid)):
            return
        self._adopted = None
        if self._proc is None and await self._adopt() is not None:
            return  # the server an earlier gateway started runs on: adopted, not launched
        await self._check_port()
        command = [sys.executable if word == PYTHON else word for word in self._config.command]
        await self._end_tail()  # the last run's output, read to its end
        self._ring.extend(await asyncio.to_thread(self._output.earlier_lines))
        read_end, write_end = await self._start_relay()
        try:
            self._proc = await start_child(  # off the loop (`app.runtimes.child`)
                command,
                env=child_gpus_env(gpus, self._env),  # it sees only where it was placed
                cwd=self._config.cwd,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                start_new_session=True,  # own process group, so stop reaches its children
            )
        except OSError as exc:
            raise RuntimeFailure(
                f"backends.{self._backend}.runtime.command: cannot run "
                f"{self._config.command[0]!r}: {exc.strerror or exc}"
            ) from None
        finally:
            os.close(write_end)  # the server has it now (or nobody: the relay ends)
            os.close(read_end)
        logger.info("process started backend=%s pid=%d", self._backend, self._proc.pid)
        self._record(self._proc.pid, tuple(command), gpus)
        self._begin_tail()

    async def _start_relay(self) -> tuple[int, int]:
        """The relay between the server's output and its file, reading a new pipe: both
        ends of the pipe, for the caller to give the write end to the server and close."""
        path = self._output.path
        try:
            await asyncio.to_thread(_openable, path)
            read_end, write_end = os.pipe()
        except OSError as exc:
            raise RuntimeFailure(
                f"backend {self._backend!r}: cannot open its output file "
                f"{path} (state_dir): {exc.strerror or exc}"
            ) from None
        try:
            self._relay = await start_child(
                relay_command(path),
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=PACKAGE_ROOT,
                env={},
                start_new_session=True,  # the server's group signals do not reach it
            )
        except OSError as exc:
            os.close(read_end)
            os.close(write_end)
            raise RuntimeFailure(
                f"backend {self._backend!r}: cannot start its output relay: {exc.strerror or exc}"
            ) from None
        return read_end, write_end

    async def _check_port(self) -> None:
        """Raise `PortInUse` when something answers on its port already."""
        if self._address is None:
            return
        host, port = self._address
        if await taken(host, port):
            logger.error("port in use, not starting backend=%s host=%s port=%d",
                         self._backend, host, port)  # fmt: skip
            raise PortInUse(port_in_use_message(self._backend, host, port))

    def _record(self, pid: int, cmdline: tuple[str, ...], gpus: tuple[int, ...]) -> None:
        """`cmdline`: the argv it was started with, kept for logs (not what /proc shows:
        a `#!` script reads as its interpreter, then the script; and read now, the exec
        races this call). The start time is what identifies it."""
        observed = observe(pid)  # the start time is the fork's: already final
        if observed is None or observed.zombie:
            return  # already exited: nothing to find again
        self._book.put(
            ProcessRecord(
                backend=self._backend,
                pid=pid,
                start_time=observed.start_time,
                boot_id=observed.boot_id,
                cmdline=cmdline,
                port=self._port,
                launch=self._launch,
                stop_grace_s=self._config.stop_grace_s,
                gpus=gpus,
            )
        )

    def _begin_tail(self) -> None:
        self._ring.begin_run()
        proc, adopted, relay = self._proc, self._adopted, self._relay
        tail = self._tail(proc, adopted, relay)
        self._tail_task = spawn(tail, name=f"process-output:{self._backend}")

    async def _tail(
        self,
        proc: Child | None,
        adopted: ProcessRecord | None,
        relay: Child | None,
    ) -> None:
        """Read its output file into the ring (off the loop, bounded) until it exited,
        then (once the relay wrote the last of it) to the file's end."""
        try:
            while _running(proc, adopted):
                self._take(await asyncio.to_thread(self._output.read))
                await asyncio.sleep(TAIL_POLL_S)
            if relay is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(relay.wait(), RELAY_END_S)
            self._take(await asyncio.to_thread(self._output.read_to_end))
        finally:
            self._ring.end_run()

    def _take(self, got: OutputRead) -> None:
        self._ring.extend(got.lines)
        if got.dropped_lines:
            self._counts.dropped_lines(got.dropped_lines)
        if got.skipped_bytes:
            self._counts.skipped_bytes(got.skipped_bytes)

    async def _end_tail(self) -> None:
        task, self._tail_task = self._tail_task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(task, 2.0)
        except TimeoutError:
            task.cancel()

    async def logs(self, *, tail: int, follow: bool) -> AsyncIterator[str]:
        return self._ring.logs(tail, follow)

    def run_output(self) -> AsyncIterator[str]:
        return self._ring.run_output()

    @property
    def output_file(self) -> Path:
        return self._output.path

    async def status(self) -> RuntimeStatus:
        if self._proc is None and self._adopted is None:
            await self._adopt()
        if self._adopted is not None:
            return self._adopted_status(self._adopted)
        if self._proc is None:
            return RuntimeStatus(running=False, detail="not started")
        code = self._proc.returncode
        if code is None:
            return RuntimeStatus(running=True, detail=f"pid {self._proc.pid}")
        self._book.drop(self._backend)
        return RuntimeStatus(running=False, exit_code=code, detail=f"exited ({code})")

    async def _adopt(self) -> ProcessRecord | None:
        """This backend's server as an earlier gateway recorded it, if it still runs and
        was started with the launch settings configured now: adopted (its output read on
        from the file's last lines)."""
        record = self._book.records().get(self._backend)
        if record is None:
            return None
        if verdict(record, observe(record.pid), self._launch) is not Verdict.ADOPT:
            return None  # `sweep_orphans` deals with it
        logger.info("adopting process backend=%s pid=%d", self._backend, record.pid)
        self._adopted = record  # before the wait: a second caller sees it adopted
        self._relay = None  # its relay is the earlier gateway's child (it ends by itself)
        self._ring.extend(await asyncio.to_thread(self._output.skip_to_end))
        self._begin_tail()
        return record

    def _adopted_status(self, record: ProcessRecord) -> RuntimeStatus:
        if same_process(record, observe(record.pid)):
            return RuntimeStatus(
                running=True, detail=f"pid {record.pid} (adopted)", gpus=record.gpus
            )
        self._adopted = None
        self._book.drop(self._backend)
        # Not our child: its exit code went to whoever reaped it.
        return RuntimeStatus(running=False, detail=f"adopted pid {record.pid} exited")

    async def stop(self) -> None:
        adopted, self._adopted = self._adopted, None
        if adopted is not None:
            await terminate(adopted)
            self._book.drop(self._backend)
            await self._end_tail()
            return
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
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
        _signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
        self._book.drop(self._backend)
        await self._end_tail()
        logger.info("process stopped backend=%s exit_code=%s", self._backend, proc.returncode)

    def describe(self) -> str:
        return f"process {' '.join(self._config.command)!r}"


def _openable(path: Path) -> None:
    """Raise `OSError` when the relay could not write `path` (its directory made 0700)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))


def relay_command(path: Path, *, cap: int = FILE_MAX_BYTES) -> list[str]:
    """The relay writing a server's output to `path` (`app.runtimes.output_relay`)."""
    return [sys.executable, "-m", "app.runtimes.output_relay", str(path), "--cap", str(cap)]


def _running(proc: Child | None, adopted: ProcessRecord | None) -> bool:
    if adopted is not None:
        return same_process(adopted, observe(adopted.pid))
    return proc is not None and proc.returncode is None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already gone
        os.killpg(pgid, sig)


async def terminate(record: ProcessRecord) -> None:
    """Stop a process the gateway did not start in this run (its group: SIGTERM, up to
    `stop_grace_s`, then SIGKILL), polling /proc for its exit; raises `RuntimeFailure`
    when it is still there after the SIGKILL."""
    if not same_process(record, observe(record.pid)):
        return  # gone already; the pid may be someone else's now: no signal
    _signal_group(record.pid, signal.SIGTERM)
    if not await _gone(record, record.stop_grace_s):
        logger.warning("process ignored SIGTERM, killing backend=%s pid=%d grace_s=%g",
                       record.backend, record.pid, record.stop_grace_s)  # fmt: skip
    # What is left of the group goes now (the leader's pid is its group's id).
    _signal_group(record.pid, signal.SIGKILL)
    if not await _gone(record, KILL_WAIT_S):
        raise RuntimeFailure(
            f"process {record.pid} of backend {record.backend!r} is still there "
            f"{KILL_WAIT_S:g}s after SIGKILL"
        )
    logger.info("process stopped backend=%s pid=%d (adopted)", record.backend, record.pid)


async def _gone(record: ProcessRecord, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while same_process(record, observe(record.pid)):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(EXIT_POLL_S)
    return True


async def sweep_orphans(book: RecordBook, wanted: Mapping[str, str]) -> None:
    """At gateway start, before any backend is brought up: records whose process is gone
    are dropped; processes the configuration no longer wants (`wanted`: backend name ->
    launch hash of each process backend configured now) are stopped. What is left is
    adopted by each backend's runtime."""
    stops: list[ProcessRecord] = []
    for name, record in book.records().items():
        match verdict(record, observe(record.pid), wanted.get(name)):
            case Verdict.DROP:
                logger.info("process record dropped, process gone backend=%s pid=%d",
                            name, record.pid)  # fmt: skip
                book.drop(name)
            case Verdict.STOP:
                why = "launch settings changed" if name in wanted else "backend removed"
                logger.warning("stopping process left by an earlier gateway backend=%s "
                               "pid=%d why=%s", name, record.pid, why)  # fmt: skip
                stops.append(record)
            case Verdict.ADOPT:
                pass
    results = await asyncio.gather(*(terminate(r) for r in stops), return_exceptions=True)
    for record, result in zip(stops, results, strict=True):
        if isinstance(result, BaseException):
            logger.error("cannot stop process left by an earlier gateway backend=%s pid=%d "
                         "error=%s", record.backend, record.pid, result)  # fmt: skip
        else:
            book.drop(record.backend)
