"""A typed, gated fake of the `Runtime` protocol for lifecycle and admission tests.

`FakeRuntime` runs nothing. A test steers it through plain attributes:

- `start_gate` / `stop_gate`: `asyncio.Event`s that `start()` / `stop()` wait on after
  counting the call. Both are open by default; pass `start_open=False` (or clear the
  event) to hold a start or a stop where the test can look at the state in between,
  then `set()` the gate to let it finish.
- `start_called` / `stop_called`: events set as soon as `start()` / `stop()` is entered
  (before the gate), so a test can wait for "the runtime was asked" without polling.
- `starts` / `stops` / `status_calls`: how often each method was called.
- `running`, `exit_code`, `detail`: what `status()` reports. `start()` sets `running`
  once its gate opens; `stop()` clears it; `exit(code)` makes the server die.
- `start_error` / `stop_error` / `status_error`: a `RuntimeFailure` to raise instead.

    runtime = FakeRuntime(start_open=False)
    task = asyncio.create_task(backend.start())
    await runtime.start_called.wait()   # the backend asked the runtime to start
    ...                                 # look at the backend while it is starting
    runtime.start_gate.set()            # let the start return
    await task
"""

from __future__ import annotations

import asyncio

from app.runtimes.base import RuntimeFailure, RuntimeStatus


class FakeRuntime:
    """A managed runtime (by default) whose start and stop wait on test-owned gates."""

    def __init__(
        self,
        *,
        kind: str = "fake",
        managed: bool = True,
        stop_on_shutdown: bool = True,
        start_open: bool = True,
        stop_open: bool = True,
    ) -> None:
        self.kind = kind
        self.managed = managed
        self.stop_on_shutdown = stop_on_shutdown
        self.start_gate = asyncio.Event()
        self.stop_gate = asyncio.Event()
        if start_open:
            self.start_gate.set()
        if stop_open:
            self.stop_gate.set()
        self.start_called = asyncio.Event()
        self.stop_called = asyncio.Event()
        self.starts = 0
        self.started_on: list[tuple[int, ...]] = []  # the GPUs of each start
        self.stops = 0
        self.status_calls = 0
        self.running = False
        self.exit_code: int | None = None
        self.detail = ""
        self.start_error: RuntimeFailure | None = None
        self.stop_error: RuntimeFailure | None = None
        self.status_error: RuntimeFailure | None = None

    async def start(self, gpus: tuple[int, ...] = (0,)) -> None:
        self.starts += 1
        self.started_on.append(gpus)
        self.start_called.set()
        await self.start_gate.wait()
        if self.start_error is not None:
            raise self.start_error
        self.running = True
        self.exit_code = None

    async def stop(self) -> None:
        self.stops += 1
        self.stop_called.set()
        await self.stop_gate.wait()
        if self.stop_error is not None:
            raise self.stop_error
        self.running = False

    async def status(self) -> RuntimeStatus:
        self.status_calls += 1
        if self.status_error is not None:
            raise self.status_error
        return RuntimeStatus(running=self.running, exit_code=self.exit_code, detail=self.detail)

    def describe(self) -> str:
        return f"{self.kind} runtime"

    def exit(self, code: int, detail: str = "") -> None:
        """The server dies on its own: `status()` reports it gone with `code`."""
        self.running = False
        self.exit_code = code
        self.detail = detail
