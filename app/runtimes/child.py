"""A child process started off the event loop and waited for on it without a thread.

Under uvloop (the gateway's loop: `uvicorn[standard]` brings it), asyncio's
`create_subprocess_exec` is libuv's spawn, a `fork()` of the whole gateway on the loop:
it copies the page tables of every mapped byte. With a 300 MB heap the loop stood still
16-42 ms a spawn, and a process backend's start spawns two (its output relay, then the
server): `bench/looplag.py`. `start_child` runs `subprocess.Popen` in a thread instead (where
CPython spawns with `vfork()`, which copies nothing), and `Child.wait` waits for the exit
on a pidfd the loop watches (Linux 5.3+), no thread held for it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Sequence
from typing import Any


class Child:
    """A child's pid, its exit code once it exited (`returncode`, None before) and
    `wait()`: what the process runtime needs of an `asyncio.subprocess.Process`."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """Its exit code, None while it runs (a `waitpid` that does not wait: it reaps)."""
        return self._popen.poll()

    async def wait(self) -> int:
        """Wait until it exited; its exit code (negative: the signal that ended it)."""
        code = self._popen.poll()
        if code is not None:
            return code
        try:
            pidfd = os.pidfd_open(self._popen.pid)
        except ProcessLookupError:  # it exited and was reaped since
            return self._popen.wait()
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def readable() -> None:  # the pidfd reads as ready once the process exited
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, readable)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        return self._popen.wait()  # exited: reaps at once


async def start_child(command: Sequence[str], **popen: Any) -> Child:
    """`subprocess.Popen(command, **popen)` in a thread; raises `OSError` as it does."""

    def started() -> subprocess.Popen[bytes]:
        return subprocess.Popen(list(command), **popen)

    return Child(await asyncio.to_thread(started))
