"""A start that fails says what the server's output said and where to read all of it
(`microscheduler logs NAME`), for a runtime whose output the gateway reads."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import CollectorRegistry

from app.lifecycle.metrics import LifecycleMetrics
from app.lifecycle.server import Server, StartFailed
from app.runtimes.output import OutputSource
from app.upstreams.vllm import VllmClient
from app.upstreams.vllm_output import FAILURES
from tests.fakes.runtimes import FakeRuntime
from tests.fixtures.real_vllm import real_output as output

LOGS_HINT = "(its output: `microscheduler logs llm`)"


class PrintingRuntime(FakeRuntime):
    """A `FakeRuntime` whose server printed `lines`: an `OutputSource` whose run's output
    is those lines, then ends (as when the server has exited)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    async def _each(self) -> AsyncIterator[str]:
        for line in self.lines:
            yield line

    async def logs(self, *, tail: int, follow: bool) -> AsyncIterator[str]:
        return self._each()

    def run_output(self) -> AsyncIterator[str]:
        return self._each()


def unhealthy(request: httpx.Request) -> httpx.Response:
    return httpx.Response(503)


def server_on(runtime: FakeRuntime) -> Server:
    client = httpx.AsyncClient(transport=httpx.MockTransport(unhealthy))
    vllm = VllmClient(client, "http://backend:8000")
    return Server("llm", runtime, vllm, LifecycleMetrics(CollectorRegistry()))


async def failed_start(runtime: FakeRuntime, *, exit_code: int | None) -> str:
    server = server_on(runtime)
    await server.launch(wake=False)
    if exit_code is not None:
        runtime.exit(exit_code)
    try:
        with pytest.raises(StartFailed) as info:
            await server.wait_healthy(0.3)
    finally:
        await server.end_watch()
    return str(info.value)


async def test_an_exit_quotes_the_real_line_with_its_hint_and_names_the_logs_command() -> None:
    runtime = PrintingRuntime(output("unknown_flag.txt"))
    assert isinstance(runtime, OutputSource)
    said = await failed_start(runtime, exit_code=2)
    hint = next(f.hint for f in FAILURES if f.key == "unknown_flag")
    assert said == (
        "exited with code 2 before it was ready; it said: "
        f'"vllm: error: unrecognized arguments: --bogus" (hint: {hint}) {LOGS_HINT}'
    )


async def test_an_exit_with_nothing_recognised_still_names_the_logs_command() -> None:
    runtime = PrintingRuntime(["Triton is installed, but doesn't include CPU backend.\n"])
    said = await failed_start(runtime, exit_code=1)
    assert said == f"exited with code 1 before it was ready {LOGS_HINT}"


async def test_a_start_timeout_names_the_logs_command() -> None:
    runtime = PrintingRuntime(output("start_cpu.txt")[:10])  # still resolving its config
    said = await failed_start(runtime, exit_code=None)
    assert said == f"not healthy 0.3s after start (start_timeout_s); stopped it {LOGS_HINT}"
    assert runtime.stops == 1


async def test_a_runtime_without_output_names_no_logs_command() -> None:
    runtime = FakeRuntime()
    assert not isinstance(runtime, OutputSource)
    said = await failed_start(runtime, exit_code=1)
    assert said == "exited with code 1 before it was ready"
