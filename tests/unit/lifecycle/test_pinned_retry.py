"""A pinned backend that is down is started again in the background, with a backoff that
doubles from its base: after a failed start or a crash (FAILED), and after admission found
no room for its start (STOPPED, `backend_no_vram`), which used to wait for a request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.errors import BackendUnavailable
from app.lifecycle.admission import AdmissionRefused, Claimant, Unchecked
from app.lifecycle.state import BackendState
from tests.fakes.waits import until
from tests.unit.lifecycle.test_backend_lifecycle import LAZY, GatedRuntime, make_backend, state_of

PINNED: dict[str, Any] = {"vram_mib": 1000, "runtime": {"kind": "process", "command": ["x"]}}


class RoomLater(Unchecked):
    """Refuses every start until the test sets `room`."""

    def __init__(self) -> None:
        self.room = asyncio.Event()
        self.refusals = 0

    @contextlib.asynccontextmanager
    async def admit(self, backend: Claimant, *, wake: bool = False) -> AsyncIterator[None]:
        if not self.room.is_set():
            self.refusals += 1
            raise AdmissionRefused("GPU 0: 23000 of 24576 MiB in use: other processes")
        yield


async def test_a_pinned_backend_refused_for_vram_is_retried_by_the_watch() -> None:
    runtime = GatedRuntime()
    runtime.gate.set()
    admission = RoomLater()
    backend = make_backend(runtime, admission=admission, restart_backoff_s=0.05, **PINNED)
    with pytest.raises(BackendUnavailable):
        await backend.start()
    assert backend.state is BackendState.STOPPED
    assert backend.watcher.restart_in_s is not None
    assert 0 < backend.watcher.restart_in_s <= 0.05
    await backend.watcher.watch()  # within the backoff: nothing
    assert admission.refusals == 1
    await asyncio.sleep(0.06)  # the thing under test: the 0.05 s backoff passes
    await backend.watcher.watch()
    await until(lambda: admission.refusals == 2, what="the retry")
    await until(lambda: state_of(backend) is BackendState.STOPPED, what="refused again")
    assert backend.watcher.restart_in_s is not None
    assert backend.watcher.restart_in_s > 0.05  # doubled: the second refusal in a row
    admission.room.set()
    await asyncio.sleep(0.11)
    await backend.watcher.watch()
    await until(lambda: state_of(backend) is BackendState.READY, what="the start")
    assert backend.watcher.restart_in_s is None
    assert runtime.starts == 1


async def test_a_lazy_backend_refused_for_vram_waits_for_a_request() -> None:
    runtime = GatedRuntime()
    admission = RoomLater()
    backend = make_backend(runtime, admission=admission, restart_backoff_s=0.01, **LAZY)
    with pytest.raises(BackendUnavailable):
        await backend.start()
    assert backend.watcher.restart_in_s is None
    await asyncio.sleep(0.02)
    await backend.watcher.watch()
    assert admission.refusals == 1
