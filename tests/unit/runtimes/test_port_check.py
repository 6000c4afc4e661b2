"""A process backend's port must be free before its server is launched (issue 31, point 2):
the address of its URL, the connect check (real sockets on 127.0.0.1), and the runtime
refusing to launch on a port that answers, or adopting the server it recorded there."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.runtimes import port_check
from app.runtimes.port_check import PortInUse, address_of, answers, port_in_use_message, taken
from app.runtimes.process import ProcessRuntime
from app.runtimes.process_record import MemoryBook
from app.settings import ProcessRuntimeConfig
from tests.fakes.processes import free_port


def test_the_address_of_a_backend_url() -> None:
    assert address_of("http://127.0.0.1:8001") == ("127.0.0.1", 8001)
    assert address_of("http://gpu-box:8001/") == ("gpu-box", 8001)
    assert address_of("http://[::1]:8001") == ("::1", 8001)
    assert address_of("http://localhost") == ("localhost", 80)
    assert address_of("https://localhost") == ("localhost", 443)
    assert address_of("http://localhost:99999") is None
    assert address_of("unix:///run/vllm.sock") is None


def test_the_reason_names_the_port_the_backend_and_what_to_do() -> None:
    assert port_in_use_message("x", "127.0.0.1", 8001) == (
        "port_in_use: port 8001 of backend 'x' already answers before its launch (another "
        "server: an orphan, another user's server, a second gateway); free it or give the "
        "backend another port (backends.x.url)"
    )
    assert "port 8001 on gpu-box of backend 'x'" in port_in_use_message("x", "gpu-box", 8001)


@contextlib.asynccontextmanager
async def listening() -> AsyncIterator[tuple[asyncio.Server, int]]:
    """A TCP server on a free port of 127.0.0.1 that accepts and closes."""

    async def close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(close, "127.0.0.1", 0)
    try:
        yield server, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_a_port_with_a_server_answers_and_a_free_one_does_not() -> None:
    async with listening() as (_, port):
        assert await answers("127.0.0.1", port)
        assert await taken("127.0.0.1", port, free_wait_s=0.2)
    assert not await answers("127.0.0.1", port)
    assert not await taken("127.0.0.1", port)


async def test_a_port_let_go_within_the_wait_is_free() -> None:
    """A server of ours just stopped (its workers still dying) lets go in a moment."""
    async with listening() as (server, port):
        asyncio.get_running_loop().call_later(0.15, server.close)
        assert not await taken("127.0.0.1", port, free_wait_s=2.0)


SERVER = ["{python}", "-c", "import time; time.sleep(60)"]
OUTPUT_DIR = Path(tempfile.gettempdir()) / f"microscheduler-port-test-{os.getpid()}"


def runtime(book: MemoryBook, port: int) -> ProcessRuntime:
    config = ProcessRuntimeConfig(kind="process", command=SERVER, stop_grace_s=2)
    return ProcessRuntime(
        "b", config, env=dict(os.environ), book=book, launch="h", output_dir=OUTPUT_DIR,
        port=port, address=("127.0.0.1", port),
    )  # fmt: skip


async def test_a_port_that_answers_is_refused_and_nothing_is_launched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(port_check, "FREE_WAIT_S", 0.2)
    book = MemoryBook()
    async with listening() as (_, port):
        squatted = runtime(book, port)
        with pytest.raises(PortInUse, match=f"port_in_use: port {port} of backend 'b'"):
            await squatted.start()
        assert squatted.pid is None
        assert book.records() == {}
        assert not (await squatted.status()).running


async def test_a_free_port_launches() -> None:
    book = MemoryBook()
    free = runtime(book, free_port())
    await free.start()
    try:
        assert free.pid is not None
        assert (await free.status()).running
    finally:
        await free.stop()


async def test_the_server_an_earlier_gateway_recorded_is_adopted_not_refused() -> None:
    """Its port answers (here: the test's listener, standing in for the server's): the
    record says it is ours, so the start adopts it rather than refusing or launching."""
    book = MemoryBook()
    async with listening() as (_, port):
        first = runtime(book, free_port())  # started by "the earlier gateway"
        await first.start()
        pid = first.pid
        assert pid is not None
        try:
            again = runtime(book, port)
            await again.start()  # no status() first: the start itself finds the record
            assert again.pid == pid
            assert (await again.status()).detail == f"pid {pid} (adopted)"
            await again.stop()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            await first.stop()
