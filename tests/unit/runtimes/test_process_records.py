"""Finding a process backend again after a crash: the record matching (pure), /proc as it
is, the records in the state file, and the runtime adopting and stopping a real process it
did not start."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.lifecycle.store import ProcessRecords, StateStore
from app.runtimes.process import ProcessRuntime, sweep_orphans
from app.runtimes.process_record import (
    MemoryBook,
    Observed,
    ProcessRecord,
    Verdict,
    launch_hash,
    observe,
    same_process,
    verdict,
)
from app.settings import BackendConfig, ProcessRuntimeConfig

RECORD = ProcessRecord(
    backend="vllm",
    pid=4242,
    start_time=123456,
    boot_id="boot-1",
    cmdline=("python", "-m", "vllm", "serve"),
    port=8001,
    launch="hash-1",
    stop_grace_s=10.0,
)
SAME = Observed(start_time=123456, boot_id="boot-1", cmdline=RECORD.cmdline, zombie=False)


def test_the_same_process_still_wanted_is_adopted() -> None:
    assert verdict(RECORD, SAME, "hash-1") is Verdict.ADOPT


@pytest.mark.parametrize(
    "observed",
    [
        None,  # gone
        dataclasses.replace(SAME, start_time=999999),  # pid reused by a later process
        dataclasses.replace(SAME, boot_id="boot-2"),  # the machine rebooted since
        dataclasses.replace(SAME, cmdline=("bash",)),  # another program
        dataclasses.replace(SAME, zombie=True),  # exited, not reaped yet
    ],
    ids=["gone", "pid-reused", "rebooted", "other-command", "zombie"],
)
def test_a_record_whose_process_is_not_the_same_is_dropped(observed: Observed | None) -> None:
    assert verdict(RECORD, observed, "hash-1") is Verdict.DROP


def test_the_same_process_no_longer_wanted_is_stopped() -> None:
    assert verdict(RECORD, SAME, None) is Verdict.STOP  # backend removed
    assert verdict(RECORD, SAME, "hash-2") is Verdict.STOP  # launch settings changed


def test_the_launch_hash_follows_the_launch_settings_but_not_the_stop_grace() -> None:
    def config(**runtime: object) -> BackendConfig:
        return BackendConfig(
            url="http://127.0.0.1:8001",
            models=["m"],
            runtime={"kind": "process", "command": ["vllm", "serve"], **runtime},
        )

    base = launch_hash(config())
    assert launch_hash(config(stop_grace_s=30)) == base
    assert launch_hash(config(env={"A": "1"})) != base
    assert launch_hash(config(command=["vllm", "serve", "--x"])) != base


def test_a_record_survives_the_state_file_and_a_bad_one_is_ignored(tmp_path: Path) -> None:
    records = ProcessRecords(StateStore(tmp_path))
    records.put(RECORD)
    assert ProcessRecords(StateStore(tmp_path)).records() == {"vllm": RECORD}
    store = StateStore(tmp_path)
    store.update("processes", {"vllm": RECORD.to_json(), "bad": {"pid": "x"}})
    assert ProcessRecords(store).records() == {"vllm": RECORD}
    ProcessRecords(store).drop("vllm")
    assert "vllm" not in StateStore(tmp_path).section("processes")


async def test_observe_reads_a_real_process_start_time_and_command_line() -> None:
    proc = await asyncio.create_subprocess_exec("sleep", "30", start_new_session=True)
    try:
        seen = observe(proc.pid)
        assert seen is not None
        assert seen.cmdline == ("sleep", "30")
        assert not seen.zombie
        assert seen.start_time > 0
        assert observe(proc.pid) == seen  # stable while it runs
    finally:
        proc.kill()
        await proc.wait()
    assert observe(proc.pid) is None


# -- the runtime, with real processes --------------------------------------------------

SERVER = ["{python}", "-c", "import time; time.sleep(60)"]


# The output file of backend "b": one per test process, shared by a runtime and the one
# that adopts its process.
OUTPUT_DIR = Path(tempfile.gettempdir()) / f"microscheduler-test-output-{os.getpid()}"


def runtime(book: MemoryBook, launch: str = "h") -> ProcessRuntime:
    config = ProcessRuntimeConfig(kind="process", command=SERVER, stop_grace_s=2)
    return ProcessRuntime(
        "b", config, env=dict(os.environ), book=book, launch=launch, output_dir=OUTPUT_DIR
    )


@pytest.fixture
async def orphan() -> AsyncIterator[tuple[MemoryBook, int]]:
    """A process started (and recorded) by a runtime that is then forgotten, as when the
    gateway is killed: (the book, its pid)."""
    book = MemoryBook()
    first = runtime(book)
    await first.start()
    pid = first.pid
    assert pid is not None
    assert book.records()["b"].cmdline == (sys.executable, *SERVER[1:])
    yield book, pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    await first.stop()  # reaps it (it is this test's child)


async def test_a_recorded_process_is_adopted_then_stopped_without_waitpid(
    orphan: tuple[MemoryBook, int],
) -> None:
    book, pid = orphan
    record = book.records()["b"]
    again = runtime(book)
    status = await again.status()
    assert status.running
    assert status.detail == f"pid {pid} (adopted)"
    await again.start()  # already running: nothing new
    assert again.pid == pid
    await again.stop()
    # Exited (our own child here, so left a zombie, or caught in the middle of its exit).
    assert not same_process(record, observe(pid))
    assert book.records() == {}


async def test_a_reused_pid_is_not_adopted(orphan: tuple[MemoryBook, int]) -> None:
    book, pid = orphan
    record = book.records()["b"]
    book.put(dataclasses.replace(record, start_time=record.start_time + 1))
    status = await runtime(book).status()
    assert not status.running
    assert observe(pid) is not None  # and nothing was signalled


async def test_the_sweep_stops_a_process_whose_launch_settings_changed(
    orphan: tuple[MemoryBook, int],
) -> None:
    book, pid = orphan
    record = book.records()["b"]
    await sweep_orphans(book, {"b": "another-hash"})
    assert not same_process(record, observe(pid))
    assert book.records() == {}
    assert not (await runtime(book, launch="another-hash").status()).running


async def test_the_sweep_keeps_a_wanted_process_for_its_runtime(
    orphan: tuple[MemoryBook, int],
) -> None:
    book, pid = orphan
    await sweep_orphans(book, {"b": "h"})
    assert (await runtime(book).status()).running
    assert book.records()["b"].pid == pid
