"""Slow and abusive clients against a real `microscheduler serve` (uvicorn) in front of a
fake vLLM, over raw sockets: each gets a clear 4xx or a closed connection, and a normal
request made during the attack still answers quickly (its latency is printed; run with
`-s` to see it)."""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fakes.processes import GatewayProcess, fake_vllm_process, gateway_process
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

MODEL = "hostile-model"
HEADER_TIMEOUT_S = 1.5
BODY_TIMEOUT_S = 1.5
MAX_CONNECTIONS = 50
QUICK_S = 1.0  # a normal request during an attack answers within this
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@dataclass
class Setup:
    gw: GatewayProcess
    upstream: str
    port: int = field(init=False)

    def __post_init__(self) -> None:
        port = urlsplit(self.gw.url).port
        assert port is not None
        self.port = port


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    env = {
        "MICROSCHEDULER_SERVER__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "MICROSCHEDULER_SERVER__BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "MICROSCHEDULER_SERVER__MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "MICROSCHEDULER_ACCESS_LOG": "false",
    }
    with ExitStack() as stack:
        upstream = stack.enter_context(fake_vllm_process(MODEL, "--max-tokens", "2"))
        config = {"backends": {"fake": {"url": upstream, "models": [MODEL]}}}
        gw = stack.enter_context(gateway_process(config, env=env))
        yield Setup(gw, upstream)


def normal_request(setup: Setup) -> float:
    """One chat completion on a fresh connection; its latency in seconds."""
    started = time.perf_counter()
    response = httpx.post(setup.gw.url + "/v1/chat/completions", json=CHAT, timeout=10)
    latency = time.perf_counter() - started
    assert response.status_code == 200, response.text
    return latency


def report(case: str, latency: float) -> None:
    print(f"\n{case}: normal request during the attack answered in {latency * 1000:.0f} ms")
    assert latency < QUICK_S, f"{case}: a normal request took {latency:.2f} s"


@pytest.fixture
def connect(setup: Setup) -> Iterator[Callable[[], Peer]]:
    """`connect()` opens a raw socket to the gateway; all are closed after the test."""
    opened: list[Peer] = []

    def open_one() -> Peer:
        peer = Peer(socket.create_connection(("127.0.0.1", setup.port), timeout=5))
        opened.append(peer)
        return peer

    yield open_one
    for peer in opened:
        peer.sock.close()


class Peer:
    """A raw client socket: what the gateway sent, and whether it closed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.received = b""
        self.closed_at: float | None = None

    def poll(self) -> bool:
        """Read what is there without blocking; True once the gateway closed."""
        self.sock.settimeout(0)  # a socket with a timeout would wait for readability
        try:
            while self.closed_at is None:
                try:
                    data = self.sock.recv(65536)
                except BlockingIOError:
                    return False
                except OSError:  # reset
                    data = b""
                if not data:
                    self.closed_at = time.monotonic()
                self.received += data
            return True
        finally:
            self.sock.settimeout(5)

    def answered(self) -> bool:
        """A response head arrived, or the gateway closed."""
        return self.poll() or b"\r\n\r\n" in self.received

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            self.poll()

    def status(self) -> int | None:
        if not self.received.startswith(b"HTTP/1.1 "):
            return None
        return int(self.received[9:12])

    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = json.loads(self.received.split(b"\r\n\r\n", 1)[1])["error"]
        assert set(error) >= {"message", "type", "param", "code"}
        return error


def wait_closed(peers: list[Peer], timeout_s: float) -> None:
    until_sync(
        lambda: all(p.poll() for p in peers),
        timeout_s=timeout_s,
        what=lambda: f"the gateway to close {sum(p.closed_at is None for p in peers)} sockets",
    )


def dribble(
    peers: list[Peer], data: bytes, *, interval_s: float, during: Callable[[], float]
) -> float:
    """Send `data` one byte per `interval_s` on every peer until each is closed (bounded by
    `len(data)` ticks); `during` runs after the second tick, its result is returned."""
    latency = -1.0
    for tick in range(len(data)):
        open_peers = [p for p in peers if not p.poll()]
        if not open_peers:
            break
        for peer in open_peers:
            peer.send(data[tick : tick + 1])
        if tick == 2:
            latency = during()
        time.sleep(interval_s)  # the attack's pace, not a barrier
    return latency


def test_slowloris_headers_are_cut_off(setup: Setup, connect: Callable[[], Peer]) -> None:
    peers = [connect() for _ in range(20)]
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 40
    started = time.monotonic()
    latency = dribble(peers, head, interval_s=0.5, during=lambda: normal_request(setup))
    wait_closed(peers, timeout_s=10)
    lifetimes = [p.closed_at - started for p in peers if p.closed_at is not None]
    print(f"\nslowloris: closed after {min(lifetimes):.2f}..{max(lifetimes):.2f} s")
    assert max(lifetimes) < HEADER_TIMEOUT_S + 1.5
    assert {p.status() for p in peers} == {408}
    assert {p.error()["code"] for p in peers} == {"request_timeout"}
    report("slowloris", latency)


def test_a_silent_connection_is_closed_after_the_header_timeout(
    setup: Setup, connect: Callable[[], Peer]
) -> None:
    peer = connect()
    started = time.monotonic()
    wait_closed([peer], timeout_s=10)
    assert peer.closed_at is not None
    assert peer.closed_at - started < HEADER_TIMEOUT_S + 1.5
    assert peer.received == b""  # nothing was asked, nothing is answered


def test_a_trickled_body_gets_408_and_a_closed_connection(
    setup: Setup, connect: Callable[[], Peer]
) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    peers = [connect() for _ in range(10)]
    for peer in peers:
        peer.send(head)
    started = time.monotonic()
    body = b'{"model": "' + MODEL.encode() + b'", "messages": []' + b" " * 100
    latency = dribble(peers, body, interval_s=0.5, during=lambda: normal_request(setup))
    wait_closed(peers, timeout_s=10)
    lifetimes = [p.closed_at - started for p in peers if p.closed_at is not None]
    print(f"\ntrickled body: 408 after {min(lifetimes):.2f}..{max(lifetimes):.2f} s")
    assert max(lifetimes) < BODY_TIMEOUT_S + 1.5
    assert {p.status() for p in peers} == {408}
    errors = [p.error() for p in peers]
    assert {e["code"] for e in errors} == {"request_timeout"}
    assert {e["type"] for e in errors} == {"invalid_request_error"}
    report("trickled body", latency)


@pytest.mark.parametrize("kind", ["keep-alive", "silent"])
def test_idle_connections_beyond_the_limit_are_evicted(
    setup: Setup, connect: Callable[[], Peer], kind: str
) -> None:
    peers: list[Peer] = []
    for _ in range(4 * MAX_CONNECTIONS):
        peer = connect()
        peers.append(peer)
        if kind == "keep-alive":
            peer.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            until_sync(peer.answered, timeout_s=5)
            assert peer.status() == 200
    latencies = [normal_request(setup) for _ in range(5)]
    # All but the newest (at most MAX_CONNECTIONS - 1, the normal client took one) closed.
    until_sync(
        lambda: sum(p.poll() for p in peers) >= len(peers) - MAX_CONNECTIONS + 1,
        timeout_s=5,
        what="the oldest idle connections to be closed",
    )
    still_open = sum(p.closed_at is None for p in peers)
    print(f"\nidle {kind}: {len(peers)} opened, {still_open} still open")
    assert still_open < MAX_CONNECTIONS
    report(f"idle {kind} connections", max(latencies))


def test_every_connection_busy_gets_503_then_recovers(
    setup: Setup, connect: Callable[[], Peer]
) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 10\r\n"
        b"Expect: 100-continue\r\n\r\n"
    )
    peers = [connect() for _ in range(MAX_CONNECTIONS)]
    for peer in peers:
        peer.send(head)  # each has a request in flight, waiting for its body
    until_sync(  # the gateway reads the body: each request is in flight
        lambda: all(p.poll() or b"100 Continue" in p.received for p in peers),
        timeout_s=5,
        what="100 Continue on every connection",
    )
    extra = connect()
    wait_closed([extra], timeout_s=5)
    assert extra.status() == 503
    assert extra.error()["code"] == "too_many_connections"
    assert b"retry-after: 1" in extra.received.lower()
    wait_closed(peers, timeout_s=BODY_TIMEOUT_S + 5)  # 408: the body never came
    report("after every connection was busy", normal_request(setup))


def test_headers_over_64_kib_get_431(setup: Setup, connect: Callable[[], Peer]) -> None:
    def request(size: int) -> Peer:
        peer = connect()
        filler = b"a" * size
        peer.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + filler + b"\r\n\r\n")
        until_sync(peer.answered, timeout_s=5)
        return peer

    with ThreadPoolExecutor(4) as pool:
        big = [pool.submit(request, 70 * 1024) for _ in range(8)]
        latency = normal_request(setup)
        peers = [f.result() for f in big]
    wait_closed(peers, timeout_s=5)
    statuses = {p.status() for p in peers}
    print(f"\nheaders over 64 KiB: statuses {statuses}")
    assert statuses <= {431, None}  # None: the connection was reset before the answer
    assert 431 in statuses
    assert {p.error()["code"] for p in peers if p.status()} == {"request_headers_too_large"}
    fits = request(60 * 1024)
    assert fits.status() == 200
    report("headers over 64 KiB", latency)


NESTED = b"[" * 100_000 + b"]" * 100_000
HOSTILE_JSON = {
    "invalid UTF-8": (b'{"model": "m", "x": "\xff\xfe"}', "not UTF-8"),
    "nested 100,000 deep": (b'{"model": "m", "x": ' + NESTED + b"}", "nested too deeply"),
    "NaN": (b'{"model": "m", "temperature": NaN}', "NaN"),
    "Infinity": (b'{"model": "m", "temperature": Infinity}', "Infinity"),
    "-Infinity": (b'{"model": "m", "temperature": -Infinity}', "-Infinity"),
    "1e999": (b'{"model": "m", "temperature": 1e999}', "1e999"),
    "a 5000-digit integer": (b'{"model": "m", "seed": ' + b"9" * 5000 + b"}", "too long"),
}  # fmt: skip


def test_hostile_json_gets_400_invalid_json(setup: Setup) -> None:
    # One shared client: building one per request (TLS context) would load the test's own
    # CPU, not the gateway's, and slow the measured request.
    with httpx.Client(base_url=setup.gw.url, timeout=10) as client:

        def post(body: bytes) -> httpx.Response:
            return client.post(
                "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )

        bodies = {name: body for name, (body, _) in HOSTILE_JSON.items()}
        bodies |= {f"nested 100,000 deep #{i}": HOSTILE_JSON["nested 100,000 deep"][0]
                   for i in range(10)}  # fmt: skip
        with ThreadPoolExecutor(8) as pool:
            answers = {name: pool.submit(post, body) for name, body in bodies.items()}
            latency = normal_request(setup)
            results = {name: f.result() for name, f in answers.items()}
    for name, response in results.items():
        assert response.status_code == 400, (name, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid_json", name
        assert HOSTILE_JSON[name.split(" #")[0]][1] in error["message"], (name, error)
    assert "Traceback" not in setup.gw.log()
    assert "RecursionError" not in setup.gw.log()
    report("hostile JSON", latency)


def test_valid_numbers_are_relayed_byte_for_byte(setup: Setup) -> None:
    httpx.delete(setup.upstream + "/_fake/stats")
    body = (
        '{"model": "' + MODEL + '", "messages": [{"role": "user", "content": "caf\\u00e9 ☕"}],'
        ' "temperature": 0.70, "top_p": 1e-3, "max_tokens": 2, "seed": 1.5E+2}'
    ).encode()
    response = httpx.post(
        setup.gw.url + "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    seen = httpx.get(setup.upstream + "/_fake/stats").json()["requests"]
    chat = [r for r in seen if r["path"] == "/v1/chat/completions"]
    assert chat[-1]["headers"]["content-length"] == str(len(body))
    assert chat[-1]["body"] == json.loads(body)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_gzip_bomb_is_refused_unread(setup: Setup) -> None:
    inner = b'{"model": "' + MODEL.encode() + b'", "x": "' + b"0" * (100 * 1024 * 1024) + b'"}'
    bomb = gzip.compress(inner, compresslevel=9)
    del inner
    httpx.delete(setup.upstream + "/_fake/stats")
    before = rss_kib(setup.gw.proc.pid)

    def post(_: int) -> httpx.Response:
        return httpx.post(
            setup.gw.url + "/v1/chat/completions",
            content=bomb,
            headers={"content-type": "application/json", "content-encoding": "gzip"},
            timeout=10,
        )

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(post, range(4)))
        latency = normal_request(setup)
        answers += list(pool.map(post, range(16)))
    grown = rss_kib(setup.gw.proc.pid) - before
    print(f"\ngzip bomb: {len(bomb)} bytes inflating to 100 MiB, RSS grew {grown} KiB")
    for response in answers:
        assert response.status_code == 415, response.text
        assert response.json()["error"]["code"] == "unsupported_media_type"
    assert grown < 32 * 1024
    seen = httpx.get(setup.upstream + "/_fake/stats").json()["requests"]
    chats = [r for r in seen if r["path"] == "/v1/chat/completions"]
    assert len(chats) == 1  # the normal request's; no bomb was relayed
    report("gzip bomb", latency)


def test_a_trickled_admin_body_gets_408_too(setup: Setup, connect: Callable[[], Peer]) -> None:
    head = (
        b"POST /vram/zones/hostile/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    peer = connect()
    peer.send(head)
    latency = dribble(
        [peer], b'{"mib": 1, ' + b" " * 100, interval_s=0.5, during=lambda: normal_request(setup)
    )
    wait_closed([peer], timeout_s=10)
    assert peer.status() == 408
    assert peer.error()["code"] == "request_timeout"
    report("trickled admin body", latency)


@pytest.mark.parametrize(
    ("path", "length", "status"),
    [("/v1/chat/completions", 20 * 1024 * 1024, 413), ("/no/such/path", 1000, 404)],
)
def test_an_unread_body_does_not_hold_the_connection(
    setup: Setup, connect: Callable[[], Peer], path: str, length: int, status: int
) -> None:
    peer = connect()
    peer.send(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n\r\n".encode()
    )
    peer.send(b"{")  # and the rest would trickle, unread
    wait_closed([peer], timeout_s=5)
    assert peer.status() == status
    assert b"connection: close" in peer.received.lower()
