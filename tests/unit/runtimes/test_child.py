"""`app.runtimes.child`: a process backend's server and its output relay are spawned off
the event loop's thread (uvloop's own spawn forks the whole gateway on the loop), and
waited for on the loop through a pidfd."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from app.runtimes.child import start_child
from app.runtimes.process import ProcessRuntime
from app.runtimes.process_record import MemoryBook
from app.settings import ProcessRuntimeConfig

SPAWNED: list[tuple[int, str]] = []  # (thread, command) of each Popen while `RECORDING`
RECORDING = threading.Event()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "subprocess.Popen" and RECORDING.is_set():
        SPAWNED.append((threading.get_ident(), " ".join(map(str, args[1]))))


sys.addaudithook(_audit)  # there is no removing one: it records only while asked to


async def test_a_child_is_waited_for_and_its_exit_code_kept() -> None:
    child = await start_child([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert await child.wait() == 3
    assert child.returncode == 3
    assert await child.wait() == 3  # again: the same code, at once


async def test_a_running_child_has_no_exit_code_and_two_waiters_see_its_signal() -> None:
    child = await start_child(["sleep", "30"])
    assert child.returncode is None
    waiters = [asyncio.create_task(child.wait()) for _ in range(2)]
    await asyncio.sleep(0)  # both wait on their pidfd
    assert not any(w.done() for w in waiters)
    os.kill(child.pid, signal.SIGKILL)
    assert await asyncio.wait_for(asyncio.gather(*waiters), 10) == [-9, -9]
    assert child.returncode == -9


async def test_a_process_backend_is_spawned_off_the_loops_thread(tmp_path: Path) -> None:
    config = ProcessRuntimeConfig(
        kind="process", command=["{python}", "-c", "import time; time.sleep(30)"]
    )
    runtime = ProcessRuntime(
        "b", config, env={}, book=MemoryBook(), launch="h", output_dir=tmp_path / "logs"
    )
    SPAWNED.clear()
    RECORDING.set()
    try:
        await runtime.start()
    finally:
        RECORDING.clear()
        await runtime.stop()
    loop_thread = threading.get_ident()
    commands = [command for _, command in SPAWNED]
    assert any("app.runtimes.output_relay" in c for c in commands), commands
    assert any("time.sleep(30)" in c for c in commands), commands
    # uvloop's create_subprocess_exec forked on the loop (no Popen at all); asyncio's
    # own ran Popen on the loop's thread. Both held the loop for the spawn.
    assert [thread for thread, _ in SPAWNED if thread == loop_thread] == []
