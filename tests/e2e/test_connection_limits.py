"""The connection layer at its limits, against a real `microscheduler serve` (uvicorn) in
front of a fake vLLM, over raw asyncio sockets on 127.0.0.1: heads dribbled by more
sockets than `max_connections` do not lock normal clients out; at a cap where every
connection is busy, /health and /ready still answer and everyone else reads a 503
envelope (not a reset); trailer fields count against `max_header_bytes`.

The full-size cases (1,100 and 2,000 dribblers at the default cap) are `bench/soak.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fakes.processes import fake_vllm_process, gateway_process
from tests.fakes.waits import until

pytestmark = pytest.mark.e2e

HOST = "127.0.0.1"
MODEL = "limits-model"
MAX_CONNECTIONS = 50
DRIBBLERS = 2 * MAX_CONNECTIONS
DRIBBLE_S = 2.0  # a dribbler sends one more header line this often (the probe's pace)
HEADER_TIMEOUT_S = 30.0  # longer than a test: no dribbler is cut by the header timeout
BODY_TIMEOUT_S = 10.0  # the busy connections' bodies never come; the tests end before this
QUEUE_TIMEOUT_S = 2.0  # a request over a busy cap waits this long for a connection, then 503
MAX_HEADER_BYTES = 64 * 1024
QUICK_S = 2.0  # every normal request during an attack answers within this
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
DRIBBLE_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"


@dataclass
class Gateway:
    url: str
    port: int


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft >= 4 * DRIBBLERS, f"ulimit -n is {soft}: these tests open ~{3 * DRIBBLERS} sockets"
    env = {
        "MICROSCHEDULER_SERVER__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "MICROSCHEDULER_SERVER__BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "MICROSCHEDULER_SERVER__MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "MICROSCHEDULER_SERVER__QUEUE_TIMEOUT_S": str(QUEUE_TIMEOUT_S),
        "MICROSCHEDULER_ACCESS_LOG": "false",
    }
    with ExitStack() as stack:
        upstream = stack.enter_context(fake_vllm_process(MODEL, "--max-tokens", "2"))
        config = {"backends": {"fake": {"url": upstream, "models": [MODEL]}}}
        gw = stack.enter_context(gateway_process(config, env=env, wait_ready=True))
        port = urlsplit(gw.url).port
        assert port is not None
        yield Gateway(gw.url, port)


@dataclass
class Answer:
    """What a raw client read: the response bytes, and whether the connection was reset."""

    data: bytes
    reset: bool

    @property
    def status(self) -> int | None:
        return int(self.data[9:12]) if self.data.startswith(b"HTTP/1.1 ") else None

    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = json.loads(self.data.split(b"\r\n\r\n", 1)[1])["error"]
        assert set(error) >= {"message", "type", "param", "code"}
        return error


async def read_all(reader: asyncio.StreamReader, timeout_s: float = 10) -> Answer:
    data = b""
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await reader.read(65536):
                data += chunk
    except ConnectionResetError:
        return Answer(data, reset=True)
    return Answer(data, reset=False)


async def raw_request(port: int, request: bytes) -> Answer:
    """One request on a fresh connection, read to the gateway's close."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(request)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return await read_all(reader)
    finally:
        writer.close()


def chat_request(body: bytes = json.dumps(CHAT).encode()) -> bytes:
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class Dribblers:
    """`count` sockets that each send a request line and Host, then one header line every
    `DRIBBLE_S`; one the gateway closes reconnects after `DRIBBLE_S`."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.opened = self.closed = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def _one(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(HOST, self.port)
            except OSError:
                await asyncio.sleep(DRIBBLE_S)  # the attack's pace
                continue
            self.opened += 1
            try:
                writer.write(DRIBBLE_HEAD)
                for n in range(10_000):
                    try:
                        async with asyncio.timeout(DRIBBLE_S):  # the attack's pace
                            if not await reader.read(65536):
                                break  # the gateway closed
                    except TimeoutError:
                        writer.write(b"X-Drip-%d: x\r\n" % n)
            except ConnectionError:
                pass
            finally:
                writer.close()
                self.closed += 1
            await asyncio.sleep(DRIBBLE_S)

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._one()) for _ in range(self.count)]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def dribbling(port: int, count: int) -> AsyncIterator[Dribblers]:
    attack = Dribblers(port, count)
    attack.start()
    try:
        yield attack
    finally:
        await attack.stop()


@pytest.mark.parametrize(
    ("dribblers", "requests"),
    # Three times the cap, 80 requests: the outside probe's case (3,000 at a cap of
    # 1,000), where 2 of 80 got no response.
    [(DRIBBLERS, 20), (3 * MAX_CONNECTIONS, 80)],
)
async def test_dribbled_heads_do_not_lock_normal_clients_out(
    gateway: Gateway, dribblers: int, requests: int
) -> None:
    async with dribbling(gateway.port, dribblers) as attack:
        # The cap is reached: the gateway turned at least the surplus away.
        await until(
            lambda: attack.opened >= dribblers and attack.closed >= dribblers - MAX_CONNECTIONS,
            timeout_s=15,
            what=lambda: (
                f"{dribblers} dribblers opened ({attack.opened}), "
                f"{dribblers - MAX_CONNECTIONS} turned away ({attack.closed})"
            ),
        )
        latencies: list[float] = []
        limits = httpx.Limits(max_keepalive_connections=0)  # a fresh connection each
        async with httpx.AsyncClient(base_url=gateway.url, limits=limits, timeout=10) as client:
            for _ in range(requests):
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=CHAT)
                latencies.append(time.perf_counter() - started)
                assert response.status_code == 200, response.text
            health = await client.get("/health")
            assert health.status_code == 200, health.text
    print(
        f"\n{dribblers} dribblers: {requests} normal requests, max {max(latencies) * 1000:.0f} ms"
    )
    assert max(latencies) < QUICK_S


@contextlib.asynccontextmanager
async def every_connection_busy(port: int) -> AsyncIterator[None]:
    """`MAX_CONNECTIONS` connections, each with a request in flight (its body awaited)."""
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10\r\nExpect: 100-continue\r\n\r\n"
    )
    writers: list[asyncio.StreamWriter] = []

    async def busy() -> None:
        reader, writer = await asyncio.open_connection(HOST, port)
        writers.append(writer)
        writer.write(head)
        async with asyncio.timeout(5):  # the gateway reads the body: the request is in flight
            assert b"100 Continue" in await reader.readuntil(b"\r\n\r\n")

    try:
        for _ in range(MAX_CONNECTIONS):
            await busy()
        yield
    finally:
        for writer in writers:
            writer.close()


async def test_probes_answer_when_every_connection_is_busy(gateway: Gateway) -> None:
    async with every_connection_busy(gateway.port):
        health = await raw_request(gateway.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        ready = await raw_request(gateway.port, b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (health.status, ready.status) == (200, 200), (health, ready)
        assert b"connection: close" in health.data.lower()
        # Silent sockets over the cap cannot hold the probes' reserve.
        silent = [await asyncio.open_connection(HOST, gateway.port) for _ in range(20)]
        health = await raw_request(gateway.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert health.status == 200, health
        answers = [await read_all(reader) for reader, _ in silent]
        for _, writer in silent:
            writer.close()
        assert {a.status for a in answers} == {503}
        # Nor can sockets that ask for /health and never finish their head.
        posing = [await asyncio.open_connection(HOST, gateway.port) for _ in range(20)]
        for _, writer in posing:
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
        health = await raw_request(gateway.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert health.status == 200, health
        for _, writer in posing:
            writer.close()
        other = await raw_request(gateway.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert other.status == 503, other
        assert other.error()["code"] == "too_many_connections"


async def test_refusals_at_the_cap_are_read_not_reset(gateway: Gateway) -> None:
    async with every_connection_busy(gateway.port):
        body = json.dumps({**CHAT, "pad": "x" * 20_000}).encode()  # more than one segment
        answers = await asyncio.gather(
            *(raw_request(gateway.port, chat_request(body)) for _ in range(30))
        )
    resets = sum(a.reset for a in answers)
    statuses = [a.status for a in answers]
    print(f"\n30 clients at a busy cap: {resets} resets, statuses {set(statuses)}")
    assert resets == 0
    assert statuses == [503] * 30
    for answer in answers:
        assert answer.error()["code"] == "too_many_connections"
        assert b"retry-after: 1" in answer.data.lower()


def chunked_head() -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


async def test_trailers_over_the_head_limit_get_431(gateway: Gateway) -> None:
    reader, writer = await asyncio.open_connection(HOST, gateway.port)
    try:
        writer.write(chunked_head() + chunk(json.dumps(CHAT).encode()) + b"0\r\n")
        field = b"X-Trailer-%05d: " + b"t" * 1000 + b"\r\n"
        with contextlib.suppress(ConnectionError):
            for n in range(16 * MAX_HEADER_BYTES // 1000):  # 16 times the limit
                writer.write(field % n)
                await writer.drain()
            writer.write(b"\r\n")
            await writer.drain()
        answer = await read_all(reader)
    finally:
        writer.close()
    assert answer.status == 431, answer
    assert answer.error()["code"] == "request_headers_too_large"
    assert "trailer" in answer.error()["message"]


async def test_one_long_trailer_field_gets_431(gateway: Gateway) -> None:
    """httptools buffers one field whole before handing it over: it is bounded too."""
    reader, writer = await asyncio.open_connection(HOST, gateway.port)
    try:
        writer.write(chunked_head() + chunk(json.dumps(CHAT).encode()) + b"0\r\nX-Long: ")
        with contextlib.suppress(ConnectionError):
            for _ in range(64):  # 16 times the limit
                writer.write(b"t" * (16 * 1024))
                await writer.drain()
            writer.write(b"\r\n\r\n")
            await writer.drain()
        answer = await read_all(reader)
    finally:
        writer.close()
    assert answer.status == 431, answer


async def test_small_trailers_are_accepted(gateway: Gateway) -> None:
    request = chunked_head() + chunk(json.dumps(CHAT).encode()) + b"0\r\nX-Checksum: abc\r\n\r\n"
    answer = await raw_request(gateway.port, request)
    assert answer.status == 200, answer
    assert b'"chat.completion"' in answer.data
