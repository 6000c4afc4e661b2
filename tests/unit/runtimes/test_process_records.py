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
from tests.fakes.waits import until

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
        dataclasses.replace(SAME, zombie=True),  # exited, not reaped yet
    ],
    ids=["gone", "pid-reused", "rebooted", "zombie"],
)
def test_a_record_whose_process_is_not_the_same_is_dropped(observed: Observed | None) -> None:
    assert verdict(RECORD, observed, "hash-1") is Verdict.DROP


def test_a_console_script_is_the_same_process_though_proc_shows_its_interpreter_first() -> None:
    """The argv as configured is recorded; /proc shows the `#!` interpreter before the
    script (issue 31: a real vLLM was "dropped, process gone" while it ran on)."""
    configured = ("/opt/venv/bin/vllm", "serve", "Qwen/Qwen3-8B", "--port", "8001")
    record = dataclasses.replace(RECORD, cmdline=configured)
    seen = dataclasses.replace(SAME, cmdline=("/opt/venv/bin/python3.11", *configured))
    assert same_process(record, seen)
    assert verdict(record, seen, "hash-1") is Verdict.ADOPT


def test_the_command_line_is_no_part_of_the_identity() -> None:
    """A program may rewrite its own (setproctitle): pid, start time and boot decide."""
    assert verdict(RECORD, dataclasses.replace(SAME, cmdline=("VLLM::EngineCore",)), "hash-1") \
        is Verdict.ADOPT  # fmt: skip


def test_a_record_an_earlier_version_wrote_still_loads() -> None:
    written = {
        "backend": "vllm", "pid": 4242, "start_time": 123456, "boot_id": "boot-1",
        "cmdline": ["/opt/venv/bin/vllm", "serve", "m"], "port": 8001, "launch": "hash-1",
        "stop_grace_s": 10.0,
    }  # fmt: skip
    loaded = ProcessRecord.from_json(written)
    assert loaded == dataclasses.replace(RECORD, cmdline=("/opt/venv/bin/vllm", "serve", "m"))
    assert ProcessRecord.from_json({k: v for k, v in written.items() if k != "cmdline"}) == (
        dataclasses.replace(RECORD, cmdline=())
    )


def test_a_record_keeps_the_gpus_its_process_was_shown() -> None:
    placed = dataclasses.replace(RECORD, gpus=(1, 0))
    assert placed.to_json()["gpus"] == [1, 0]
    assert ProcessRecord.from_json(placed.to_json()) == placed
    assert ProcessRecord.from_json(RECORD.to_json()) == RECORD  # gpus None: not known
    assert ProcessRecord.from_json({**placed.to_json(), "gpus": ["x"]}) is None


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
        # The spawn returns after the fork; until the child's exec, /proc shows an empty
        # (or the parent's) command line. Wait for the exec, bounded.
        seen = observe(proc.pid)
        for _ in range(200):
            assert seen is not None
            if seen.cmdline == ("sleep", "30"):
                break
            await asyncio.sleep(0.025)
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


async def test_a_console_script_left_running_is_adopted(tmp_path: Path) -> None:
    """A command like `.../bin/vllm serve` (a `#!` script: /proc shows the interpreter
    first) is found again by the runtime of the next gateway."""
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    script.chmod(0o755)
    config = ProcessRuntimeConfig(kind="process", command=[str(script), "serve"], stop_grace_s=2)

    def runtime_of(book: MemoryBook) -> ProcessRuntime:
        env = dict(os.environ)
        return ProcessRuntime("b", config, env=env, book=book, launch="h", output_dir=OUTPUT_DIR)

    book = MemoryBook()
    first = runtime_of(book)
    await first.start()
    pid = first.pid
    assert pid is not None
    try:
        await until(lambda: _shows_interpreter_first(pid, script), what="the exec done")
        again = runtime_of(book)
        status = await again.status()
        assert status.detail == f"pid {pid} (adopted)"
        await again.stop()
        assert book.records() == {}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        await first.stop()


def _shows_interpreter_first(pid: int, script: Path) -> bool:
    seen = observe(pid)
    return seen is not None and seen.cmdline[1:] == (str(script), "serve")
